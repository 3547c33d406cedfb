"""Bytes a worker holds per active user for online evaluation, and the cost of recording and scoring.

    .venv/bin/python bench/online_memory.py --users 100000 --k 10

Each user gets one served list of `k` ids taken from a catalog of strings (as the engine's id map hands
them out: shared, not copied), then one arrival scores it. tracemalloc counts what the lists hold.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.online import ServedList, ServedLists
from app.store import Arrival


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--catalog", type=int, default=1682)
    args = p.parse_args()
    catalog = [str(1000 + n) for n in range(args.catalog)]

    def fill(lists: ServedLists, now: float) -> None:
        for n in range(args.users):
            items = tuple(catalog[(n + j) % args.catalog] for j in range(args.k))
            # the user id as a request brings it: a new string, kept by the list's key
            lists.record(
                "ml-100k", f"user-{n:07d}", ServedList("sasrec-ml100k", "20261126T000000Z", "live", items, now)
            )

    now = time.time()
    t0 = time.perf_counter()
    fill(ServedLists(window_s=3600, max_lists=10 * args.users), now)
    record_s = time.perf_counter() - t0
    lists = ServedLists(window_s=3600, max_lists=10 * args.users)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    fill(lists, now)
    after = tracemalloc.take_snapshot()
    held = sum(s.size_diff for s in after.compare_to(before, "filename"))
    tracemalloc.stop()
    arrivals = [Arrival("ml-100k", f"user-{n:07d}", catalog[n % args.catalog], now + 1) for n in range(args.users)]
    t0 = time.perf_counter()
    lists.score(arrivals)
    score_s = time.perf_counter() - t0
    out = {
        "users": args.users,
        "k": args.k,
        "bytes_per_active_user": round(held / args.users),
        "record_us_per_list": round(record_s / args.users * 1e6, 2),
        "score_us_per_arrival": round(score_s / args.users * 1e6, 2),
        "left_after_scoring": lists.size,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
