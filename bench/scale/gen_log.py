"""A realistic interaction log of any size, for the scale benchmarks: CSV and a Parquet folder.

    .venv/bin/python -m bench.scale.gen_log --rows 50000000 --users 2000000 --items 500000 --out runs/log50m
    # -> runs/log50m/log.csv (user_id,item_id,timestamp) and runs/log50m/parquet/part-00000.parquet ...

What makes it realistic enough to train on and to stress a loader:
  - user activity is heavy-tailed: a few users have thousands of events, most a handful (lognormal);
  - item popularity is a power law (Zipf, exponent --zipf), with ids shuffled so popularity is not
    the id order;
  - sequences have structure a sequential model can learn: each step repeats the previous item
    (--repeat), moves to one of its few "next" items (--follow; item i leads to i+1..i+3 in a hidden
    order), or jumps to a fresh popular item;
  - times increase along each user's sequence (seconds to days apart) from a user's own start, spread
    over two years.
The Parquet folder is written as Spark or DuckDB write one: part files of --part-rows rows each.
Everything is drawn from --seed, so the same command writes the same files.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

START = 1_600_000_000  # 2020-09-13, unix seconds
TWO_YEARS = 2 * 365 * 86400


def user_lengths(rng: np.random.Generator, rows: int, users: int) -> np.ndarray:
    """Events per user: 2 each, and the rest spread by lognormal activity; exactly `rows` in all."""
    if rows < 2 * users:
        raise ValueError(f"{rows} rows cannot give {users} users 2 events each")
    activity = rng.lognormal(mean=0.0, sigma=1.2, size=users)
    return 2 + rng.multinomial(rows - 2 * users, activity / activity.sum())


def generate(
    rows: int, users: int, items: int, *, zipf: float, repeat: float, follow: float, seed: int
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    lengths = user_lengths(rng, rows, users)
    user = np.repeat(np.arange(users, dtype=np.int64), lengths)
    first = np.zeros(rows, dtype=bool)
    first[np.concatenate([[0], np.cumsum(lengths)[:-1]])] = True
    # Popular items: ranks drawn from a bounded Zipf law, mapped to shuffled ids.
    ranks = np.arange(1, items + 1, dtype=np.float64)
    weights = ranks**-zipf
    popular = rng.choice(items, size=rows, p=weights / weights.sum())
    rank_to_item = rng.permutation(items)
    # Each step: jump (a fresh popular item, always at a user's first step), repeat, or follow.
    u = rng.random(rows)
    jump = first | (u >= repeat + follow)
    step = np.where(u < repeat, 0, rng.integers(1, 4, size=rows))  # follow: 1..3 places on
    # Within a run between jumps the position is the jump's item plus the summed steps since it.
    run_start = np.maximum.accumulate(np.where(jump, np.arange(rows), 0))
    offset = np.cumsum(np.where(jump, 0, step))
    offset -= offset[run_start]
    position = (popular[run_start] + offset) % items
    item = rank_to_item[position]  # the hidden order: rank r leads to ranks r+1..r+3
    # Times: a user's start anywhere in two years, then gaps from seconds to days.
    gaps = np.where(first, 0, np.exp(rng.uniform(np.log(10), np.log(3 * 86400), size=rows))).astype(np.int64)
    begin = rng.integers(0, TWO_YEARS, size=users)
    run_gap = np.cumsum(gaps)
    run_gap -= np.repeat(run_gap[first], lengths)
    timestamp = START + np.repeat(begin, lengths) + run_gap
    return pd.DataFrame(
        {
            "user_id": "u" + pd.Series(user).astype(str),
            "item_id": "i" + pd.Series(item).astype(str),
            "timestamp": timestamp,
        }
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--users", type=int, default=200_000)
    p.add_argument("--items", type=int, default=50_000)
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--repeat", type=float, default=0.15)
    p.add_argument("--follow", type=float, default=0.45)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--part-rows", type=int, default=2_000_000)
    p.add_argument("--formats", nargs="+", choices=["csv", "parquet"], default=["csv", "parquet"])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    t0 = time.perf_counter()
    df = generate(
        args.rows, args.users, args.items, zipf=args.zipf, repeat=args.repeat, follow=args.follow, seed=args.seed
    )
    print(f"generated {len(df):,} rows in {time.perf_counter() - t0:.1f} s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    # Rows in time order, as logs arrive (a loader must not rely on rows grouped by user).
    df = df.sort_values("timestamp", kind="stable", ignore_index=True)
    if "csv" in args.formats:
        t0 = time.perf_counter()
        df.to_csv(args.out / "log.csv", index=False)
        print(f"wrote {args.out / 'log.csv'} in {time.perf_counter() - t0:.1f} s", flush=True)
    if "parquet" in args.formats:
        t0 = time.perf_counter()
        folder = args.out / "parquet"
        folder.mkdir(exist_ok=True)
        for n, start in enumerate(range(0, len(df), args.part_rows)):
            df.iloc[start : start + args.part_rows].to_parquet(folder / f"part-{n:05d}.parquet", index=False)
        print(f"wrote {folder} in {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
