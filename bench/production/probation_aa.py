"""How often probation's test finds a version worse than its holdback when it is the same version, and how soon
it finds one a hundred times worse, on a replay's own lists, over many random holdbacks.

    .venv/bin/python -m bench.production.probation_aa --lists runs/heavy0/frozen_lists.csv --out runs/aa.json

The lists: every list the frozen version served in a loop replay, in the slice's order, with its user and
its NDCG@10 against the user's next item (bench/production/loop_replay.py writes them to its --work folder).
Each split draws each user into the holdback with --share's chance; the two sides' per-user sums grow list
by list as the service's do, and the test is read every --every lists, as probation reads it every tick
(app.promotion.compared: the anytime-valid test, users as the unit). The same version on both sides (A/A):
the share of splits in which it ever found the new side worse is the false rollback rate, against the
stated ALPHA. With --effect 0.01 (the new side's lists scored at a hundredth of their NDCG@10): the share of
splits in which it found it, and after how many lists. A loop replay with an identical copy promoted
(loop_replay --promote same) measures the same end to end, a few seeds at a time; this, thousands of splits.
--per-list reads each side's mean over its lists with the users' clustered variance (the estimator the
rule used before) instead of the mean of its users' means; --alpha another level than the loop's.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from typing import Any

import pandas as pd

from app.production.promotion import MIN_USERS, compared
from app.production.sequential import ALPHA, Evidence, two_sided
from app.store import UserStats


def per_list(a: dict[str, tuple[float, float]], b: dict[str, tuple[float, float]]) -> Evidence | None:
    """The earlier estimator: each side's mean over its lists, the variance the ratio estimator's over users."""
    out = []
    for side in (a, b):
        users = len(side)
        if users < MIN_USERS:
            return None
        n, s = sum(k for k, _ in side.values()), sum(x for _, x in side.values())
        m = s / n
        var = users / (users - 1) * sum((x - m * k) ** 2 for k, x in side.values()) / n**2
        out.append((m, var, users))
    return two_sided(*out[0], *out[1])


def split_once(
    users: list[str],
    ndcg: list[float],
    *,
    seed: int,
    share: float,
    effect: float,
    every: int,
    alpha: float = ALPHA,
    lists: bool = False,
) -> int | None:
    """One random holdback: the list at which the test first found the new side worse; None: never."""
    rng = random.Random(seed)
    held = {u: rng.random() < share for u in sorted(set(users))}
    sums: dict[str, tuple[float, float]] = {}
    new, old = UserStats(), UserStats()
    raw: tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]]] = ({}, {})
    for n, (u, x) in enumerate(zip(users, ndcg, strict=True)):
        side = old if held[u] else new
        before = sums.get(u)
        k, s = before or (0.0, 0.0)
        now = (k + 1, s + (x if held[u] else x * effect))
        side.move(before, now)
        sums[u] = now
        raw[held[u]][u] = now
        if n % every == every - 1:
            ev = per_list(raw[False], raw[True]) if lists else compared(new, old)
            if ev is not None and ev.difference < 0 and ev.e_value >= 1 / alpha:
                return n + 1
    return None


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """The exact 95% interval of a share k / n (beta quantiles by bisection on the binomial tail)."""

    def tail(p: float, at_least: int) -> float:
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(at_least, n + 1))

    def solve(f: Any, lo: float = 0.0, hi: float = 1.0) -> float:
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(lambda p: tail(p, k) < 0.025)
    high = 1.0 if k == n else solve(lambda p: 1 - tail(p, k + 1) > 0.025)
    return low, high


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lists", type=Path, required=True, help="a loop replay's frozen_lists.csv")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--splits", type=int, default=1000)
    p.add_argument("--share", type=float, default=0.25, help="the holdback's share (the loop replay's)")
    p.add_argument("--every", type=int, default=20, help="lists between two reads (a tick at 40 events/s)")
    p.add_argument("--from-quarter", type=int, default=0, help="start at this quarter of the slice (0-3)")
    p.add_argument("--alpha", type=float, default=ALPHA, help="the level: proof at an e-value of 1 / alpha")
    p.add_argument("--per-list", action="store_true", help="the earlier estimator: means over lists")
    args = p.parse_args()
    df = pd.read_csv(args.lists, dtype={"user_id": str}).sort_values("row", kind="stable")
    df = df[df["row"] >= df["row"].max() * args.from_quarter / 4]
    users, ndcg = df["user_id"].tolist(), df["ndcg10"].astype(float).tolist()
    report: dict[str, Any] = {
        "lists": len(df),
        "users": int(df["user_id"].nunique()),
        "top5_users_share": round(float(df["user_id"].value_counts().iloc[:5].sum() / len(df)), 3),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "alpha": args.alpha,
    }
    for name, effect in (("same", 1.0), ("hundredfold_worse", 0.01), ("half", 0.5)):
        found = [
            split_once(
                users,
                ndcg,
                seed=s,
                share=args.share,
                effect=effect,
                every=args.every,
                alpha=args.alpha,
                lists=args.per_list,
            )
            for s in range(args.splits)
        ]
        hits = sorted(n for n in found if n is not None)
        low, high = clopper_pearson(len(hits), len(found))
        report[name] = {
            "found_worse": len(hits),
            "splits": len(found),
            "share": round(len(hits) / len(found), 4),
            "share_95": [round(low, 4), round(high, 4)],
            "median_lists_to_find": hits[len(hits) // 2] if hits else None,
        }
        print(name, json.dumps(report[name]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
