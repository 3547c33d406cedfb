"""Write a namespace's histories (artifact base + live events) as a training log.

    python -m app.export_history --namespace ml-100k --out runs/ml100k_with_events.csv

Uses the same SEQSERVE_* settings as the service (store kind, SQLite path, Redis URL). The log is a
CSV with a header, quoted by the csv module so that any id (spaces, commas, quotes, newlines) reads
back exactly: `user_id,item_id,timestamp[,action]`, the timestamp empty when the data has none (e.g.
Amazon Beauty, whose order is kept). `python -m training train --data ...` reads it, so items first
seen in events become part of the catalog at the next training run. A social model's incoming steps
("<-a2q" on the target's timeline) are left out: each is the actor's event again, which the log holds.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from app.settings import Settings
from app.store import open_store
from models.social import is_incoming


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.export_history", description=__doc__.split("\n")[0])
    p.add_argument("--namespace", required=True, help="the data set's name (POST /events answers it)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    s = Settings()
    store = open_store(s.history_store, sqlite_path=s.history_path, redis_url=s.redis_url.get_secret_value(),
                       redis_prefix=s.redis_prefix, keep=s.live_events)
    try:
        timelines = {u: [e for e in store.history(args.namespace, u) if not is_incoming(e[2])]
                     for u in store.users(args.namespace)}
    finally:
        store.close()
    timelines = {u: tl for u, tl in timelines.items() if tl}
    if not timelines:
        print(f"namespace {args.namespace!r} holds no history in the {s.history_store} store", file=sys.stderr)
        return 1
    with_actions = any(a is not None for tl in timelines.values() for _, _, a in tl)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["user_id", "item_id", "timestamp", *(["action"] if with_actions else [])])
        for user, tl in timelines.items():
            for item, t, action in tl:
                ts = "" if math.isnan(t) else (f"{t:.0f}" if t == int(t) else repr(t))
                w.writerow([user, item, ts, *([action or ""] if with_actions else [])])
    n = sum(len(tl) for tl in timelines.values())
    print(f"wrote {n} interactions of {len(timelines)} users to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
