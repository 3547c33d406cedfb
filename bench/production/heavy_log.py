"""A log whose traffic a few heavy users carry, as a small market, a service at night or a B2B catalog see
it: each user's count of events drawn from a heavy tail (tens to a couple of thousand), each active over a
span of its own, so that the last fifth by time comes from a few dozen users of whom a handful send most.

    .venv/bin/python -m bench.production.heavy_log --out runs/heavy.csv [--seed 1]

What users take is learnable: items come in series (chains of CHAIN items) of unequal popularity; a user
goes on to the next item of the series they are in (most often), or starts another series, drawn by its
popularity times the user's own taste; nobody takes an item twice. Generated, as the tests' data is: no
file of anyone's is needed (bench/production/loop_replay.py --data-set heavy uses it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

CHAIN = 10  # items in a series
GO_ON = 0.75  # the chance of taking the next item of the series one is in


def heavy_log(*, users: int = 160, series: int = 800, days: float = 120.0, seed: int = 0) -> pd.DataFrame:
    """user_id, item_id, timestamp (unix seconds), in time order."""
    rng = np.random.default_rng(seed)
    counts = np.clip((rng.pareto(1.05, users) + 1) * 60, 30, 3000).astype(int)
    start = rng.uniform(0.0, 0.75, users)
    span = rng.uniform(0.1, 0.5, users)
    popularity = 1.0 / np.arange(1, series + 1) ** 0.9
    rows: list[tuple[str, str, float]] = []
    t0 = 1_700_000_000.0
    for u in range(users):
        taste = popularity * rng.gamma(0.5, 2.0, series)
        taken = np.zeros(series, dtype=int)  # items taken of each series (a user never takes one twice)
        seen: set[int] = set()
        chain, at = -1, CHAIN
        times = np.sort(rng.uniform(start[u], min(1.0, start[u] + span[u]), counts[u])) * days * 86400
        for t in times:
            if chain >= 0 and at + 1 < CHAIN and rng.random() < GO_ON:
                at += 1
            else:
                left = np.where(taken < CHAIN, taste, 0.0)
                if left.sum() <= 0:
                    break
                chain, at = int(rng.choice(series, p=left / left.sum())), 0
            while chain * CHAIN + at in seen and at + 1 < CHAIN:
                at += 1
            item = chain * CHAIN + at
            if item in seen:
                continue
            seen.add(item)
            taken[chain] += 1
            rows.append((f"h{u}", str(item + 1), round(t0 + t, 3)))
    df = pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp"])
    return df.sort_values(["timestamp", "user_id"], kind="stable").reset_index(drop=True)


def describe(df: pd.DataFrame) -> dict[str, object]:
    """Who carries the log's last fifth by time (what the loop's replay sends)."""
    tail = df.iloc[int(len(df) * 0.8) :]
    per_user = tail["user_id"].value_counts()
    return {
        "events": len(df),
        "users": int(df["user_id"].nunique()),
        "items": int(df["item_id"].nunique()),
        "last_fifth_events": len(tail),
        "last_fifth_users": int(per_user.size),
        "last_fifth_top5_share": round(float(per_user.iloc[:5].sum() / len(tail)), 3),
        "last_fifth_events_of_busiest": int(per_user.iloc[0]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    df = heavy_log(seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(describe(df))


if __name__ == "__main__":
    main()
