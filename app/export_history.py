"""Write a namespace's histories (artifact base + live events) as a training log.

    python -m app.export_history --namespace ml-100k --out runs/ml100k_with_events.csv

Uses the same SEQSERVE_* settings as the service (store kind, SQLite path, Redis URL). Timed data
becomes a `user_id,item_id,timestamp` CSV; data without times (e.g. Amazon Beauty) becomes
`user item` lines in order. Either is read by `python -m training train --data ...`, so items first
seen in events become part of the catalog at the next training run.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from app.settings import Settings
from app.store import open_store


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.export_history", description=__doc__.split("\n")[0])
    p.add_argument("--namespace", required=True, help="the data set's name (POST /events answers it)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    s = Settings()
    store = open_store(s.history_store, s.history_path, s.redis_url, s.redis_prefix)
    try:
        timelines = {u: store.history(args.namespace, u) for u in store.users(args.namespace)}
    finally:
        store.close()
    if not timelines:
        print(f"namespace {args.namespace!r} holds no history in the {s.history_store} store", file=sys.stderr)
        return 1
    timed = all(not math.isnan(t) for tl in timelines.values() for _, t in tl)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        if timed:
            w = csv.writer(f)
            w.writerow(["user_id", "item_id", "timestamp"])
            for user, tl in timelines.items():
                w.writerows((user, item, f"{t:.0f}" if t == int(t) else t) for item, t in tl)
        else:
            for user, tl in timelines.items():
                f.writelines(f"{user} {item}\n" for item, _ in tl)
    n = sum(len(tl) for tl in timelines.values())
    print(f"wrote {n} interactions of {len(timelines)} users to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
