"""Bytes a worker holds per active user for online evaluation, and the cost of recording and scoring.

    .venv/bin/python -m bench.production.online_memory --users 100000 --k 10
    .venv/bin/python -m bench.production.online_memory --service artifacts --model sasrec-ml100k \
        --users 25000 --k 1000 --variant before:/tmp/before --variant now:.

The second form asks a real server (one worker, from each code tree in turn: a `git worktree` of another
commit) for `--users` fresh users' top `--k`, each user once with a one-item history, and reports the
server's resident memory before and after: what the lists it holds for online evaluation cost at that k.

Each user gets one served list of `k` ids taken from a catalog of strings (as the engine's id map hands
them out: shared, not copied) with its reference list of 10 (the floor; --no-floor: without), then one
arrival scores it. tracemalloc counts what the lists hold.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

from app.production.online import ServedList, ServedLists
from app.production.trials import new_id
from app.store import Arrival


def through_service(args: argparse.Namespace) -> None:
    """RSS of a real server before and after it answered `args.users` fresh users once each at `args.k`."""
    import httpx2 as httpx

    from bench.servers import rss_mb, start_server, stop
    from models.artifact import latest_versions
    from models.ids import IdMap

    items = IdMap.load(latest_versions(args.service)[args.model] / "items.json").raws()
    out = {}
    for spec in args.variant:
        name, tree = spec.split(":", 1)
        limits = {"SEQSERVE_MAX_K": str(max(args.k, 100)), "SEQSERVE_MAX_TOTAL_K": str(32 * max(args.k, 100))}
        proc = start_server(args.service.resolve(), 8791, limits, root=Path(tree).resolve())
        try:
            url = "http://127.0.0.1:8791/recommend"
            with httpx.Client(timeout=60) as client:
                for n in range(200):  # warm: allocator pools and caches settle before the baseline
                    client.post(
                        url, json={"model": args.model, "queries": [{"history": [{"item_id": items[n]}], "k": args.k}]}
                    )
                before = rss_mb(proc.pid)
                for start in range(0, args.users, 32):
                    queries = [
                        {"user_id": f"fresh-{u:07d}", "history": [{"item_id": items[u % len(items)]}], "k": args.k}
                        for u in range(start, min(args.users, start + 32))
                    ]
                    r = client.post(url, json={"model": args.model, "queries": queries})
                    r.raise_for_status()
                after = rss_mb(proc.pid)
        finally:
            stop(proc)
        out[name] = {
            "rss_before_mb": round(before, 1),
            "rss_after_mb": round(after, 1),
            "bytes_per_user": round((after - before) * 2**20 / args.users),
        }
        print(name, out[name], file=sys.stderr)
    print(json.dumps({"users": args.users, "k": args.k, "variants": out}, indent=2))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--catalog", type=int, default=1682)
    p.add_argument("--no-floor", dest="floor", action="store_false", help="lists without their reference list")
    p.add_argument("--service", type=Path, help="an artifacts folder: measure a real server instead")
    p.add_argument("--model", default="sasrec-ml100k")
    p.add_argument("--variant", action="append", default=[], help="NAME:TREE, a code tree to serve from")
    args = p.parse_args()
    if args.service is not None:
        through_service(args)
        return
    catalog = [str(1000 + n) for n in range(args.catalog)]

    def fill(lists: ServedLists, now: float) -> None:
        for n in range(args.users):
            items = tuple(catalog[(n + j) % args.catalog] for j in range(args.k))
            # a live list's reference list, of the version's popular head: ids of the catalog too
            floor = tuple(catalog[j] for j in range(n % 7, n % 7 + 10)) if args.floor else ()
            # the user id as a request brings it: a new string, kept by the list's key; each answer's own
            # recommendation_id, as the service makes one
            served = ServedList("sasrec-ml100k", "20261126T000000Z", "live", items, now, None, "", new_id(), floor)
            lists.record("ml-100k", f"user-{n:07d}", served)

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
