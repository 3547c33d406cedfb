"""The event loop's part of a by-user read of heavy users on SQLite: before, the whole read of every
user's live events (up to the engine's budget, 1,000) ran on the loop for up to 8 users; now at most
app.answering.LOOP_READ_ROWS rows run there and the rest in a store thread.

    .venv/bin/python -m bench.serving.heavy_reads [--users 8 --events 1000 --repeat 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from app.answering import LOOP_READ_ROWS
from app.store import Event, SQLiteStore


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--events", type=int, default=1000)
    p.add_argument("--budget", type=int, default=1000, help="the engine's live budget (LIVE_EVENTS)")
    p.add_argument("--repeat", type=int, default=50)
    args = p.parse_args()
    store = SQLiteStore(Path(tempfile.mkdtemp(prefix="heavy-reads-")) / "h.sqlite3", keep=args.budget)
    users = [f"u{n}" for n in range(args.users)]
    for user in users:
        store.append("ns", [Event(f"{user}-{i}", user, f"i{i % 500}", 1e9 + i) for i in range(args.events)])

    def ms(limit: int) -> float:
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            store.events("ns", users, limit)
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    share = LOOP_READ_ROWS // args.users
    before, now = ms(args.budget), ms(share)
    print(
        json.dumps(
            {
                **vars(args),
                "whole_read_on_loop_ms": round(before, 2),
                "loop_share_ms": round(now, 3),
                "share_rows_per_user": share,
            }
        )
    )
    store.close()


if __name__ == "__main__":
    main()
