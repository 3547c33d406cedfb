"""By-user /recommend throughput as the history store fills: an empty store against 100,000 and
1,000,000 stored events, for SQLite and Redis.

    .venv/bin/python -m bench.production.store_fill --artifacts artifacts --model sasrec-ml100k \
        --stores sqlite redis --fills 0 100000 1000000 --seconds 8 --rounds 2

Each store is filled once per fill, directly through the store's own `append` (as /events writes): the
queried users (--queried of the artifact's users) get --per-user live events each, one of them the
whole 1,000 a user keeps (SEQSERVE_LIVE_EVENTS), in every fill; a fill of N adds N events of other
users (--spread new users in the same namespace). Then a fresh service (one worker) per store and fill
answers by-user queries for the queried users at --concurrency for --seconds; the fills are alternated
in every round (the order flipped each round) and each figure is given as a ratio to fill 0 of the same
round: what other users' events cost a user's request. A truly empty store ("empty", the queried users
without live events) runs beside them, for what a user's own live events cost.
Redis (a `redis-server` on PATH) runs on a loopback port this script starts and stops. Only
loopback is used.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.store import Event, HistoryStore, RedisStore, SQLiteStore
from bench.servers import ROOT, free_port, start_server, stop
from bench.serving.loadgen import drive
from models.artifact import latest_versions, read_manifest
from models.history_table import HistoryTable
from models.ids import IdMap
from models.queries import LIVE_EVENTS

EMPTY = -1  # the fill with no event at all
CHUNK = 5_000  # events a store call takes (a /events body holds far fewer; the fill is not what is measured)


def start_redis(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            RedisStore(url).ping()
            return proc, url
        except Exception:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("redis-server did not start")


def fill_events(
    others: int, *, queried: list[str], per_user: int, spread: int, items: list[str], seed: int = 0
) -> list[Event]:
    """`per_user` events for each queried user (the first holds LIVE_EVENTS) and `others` events over
    `spread` other users; times after the artifact's (1.7e9 on), so none counts as trained."""
    rng = random.Random(seed)
    out: list[Event] = []
    counts = [LIVE_EVENTS] + [per_user] * (len(queried) - 1)
    for user, count in zip(queried, counts, strict=True):
        out += [Event(f"q-{user}-{n}", user, rng.choice(items), 1.7e9 + n) for n in range(count)]
    out += [Event(f"s{n}", f"spread-{n % spread}", rng.choice(items), 1.7e9 + n) for n in range(others)]
    return out


def fill(store: HistoryStore, namespace: str, events: list[Event]) -> float:
    t0 = time.perf_counter()
    for start in range(0, len(events), CHUNK):
        store.append(namespace, events[start : start + CHUNK])
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    p.add_argument("--model", default="sasrec-ml100k")
    p.add_argument("--stores", nargs="+", default=["sqlite", "redis"], choices=["sqlite", "redis"])
    p.add_argument("--fills", nargs="+", type=int, default=[0, 100_000, 1_000_000], help="other users' events")
    p.add_argument("--queried", type=int, default=200, help="artifact users the load asks about")
    p.add_argument("--per-user", type=int, default=50, help="live events of each queried user")
    p.add_argument("--spread", type=int, default=20_000, help="other users the rest of a fill goes to")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--port", type=int, default=8790)
    p.add_argument("--tree", type=Path, default=ROOT, help="the code tree that serves (a worktree of another commit)")
    p.add_argument("--out", type=Path, help="also write the results here as JSON")
    args = p.parse_args()

    folder = latest_versions(args.artifacts)[args.model]
    namespace = read_manifest(folder).namespace
    table = HistoryTable(folder / "histories")
    queried = [table.user(r) for r in random.Random(1).sample(range(len(table)), args.queried)]
    items = IdMap.load(folder / "items.json").raws()
    bodies = [{"model": args.model, "queries": [{"user_id": u, "k": 10}]} for u in queried]
    work = Path(tempfile.mkdtemp(prefix="store-fill-"))
    redis_proc = None
    envs: dict[tuple[str, int], dict[str, str]] = {}
    report: dict = {"model": args.model, "tree": str(args.tree), "queried_users": len(queried), "fills": {}}
    try:
        for kind in args.stores:
            base: dict[str, str] = {"SEQSERVE_HISTORY_STORE": kind, "SEQSERVE_ONLINE_EVAL": "false"}
            if kind == "redis":
                redis_proc, url = start_redis(work)
                base["SEQSERVE_REDIS_URL"] = url
            for total in [EMPTY, *args.fills]:
                events = (
                    []
                    if total == EMPTY
                    else fill_events(total, queried=queried, per_user=args.per_user, spread=args.spread, items=items)
                )
                env = dict(base)
                if kind == "sqlite":
                    path = work / f"fill{total}.sqlite3"
                    store: HistoryStore = SQLiteStore(path)
                    env["SEQSERVE_HISTORY_PATH"] = str(path)
                else:
                    prefix = f"fill{total}:"
                    store = RedisStore(base["SEQSERVE_REDIS_URL"], prefix=prefix)
                    env["SEQSERVE_REDIS_PREFIX"] = prefix
                seconds = fill(store, namespace, events)
                store.close()
                print(f"{kind}: fill {total}: {len(events)} events stored in {seconds:.1f} s", file=sys.stderr)
                envs[(kind, total)] = env
        for kind in args.stores:
            fills = [EMPTY, *args.fills]
            runs: dict[int, list[float]] = {t: [] for t in fills}
            ratios: dict[int, list[float]] = {t: [] for t in fills}
            for rnd in range(args.rounds):
                order = fills if rnd % 2 == 0 else fills[::-1]
                got: dict[int, float] = {}
                for total in order:
                    proc = start_server(args.artifacts, args.port, envs[(kind, total)], root=args.tree.resolve())
                    try:
                        url = f"http://127.0.0.1:{args.port}/recommend"
                        got[total] = drive(url, bodies, args.concurrency, args.seconds, args.warmup)["rps"]
                    finally:
                        stop(proc)
                    print(f"{kind} round {rnd}: {total} events -> {got[total]:.0f} req/s", file=sys.stderr)
                for total in fills:
                    runs[total].append(got[total])
                    ratios[total].append(got[total] / got[args.fills[0]])
            report["fills"][kind] = {
                ("empty" if t == EMPTY else str(t)): {
                    "rps": [round(x, 1) for x in runs[t]],
                    "ratio_to_fill0": [round(x, 3) for x in ratios[t]],
                    "ratio_median": round(statistics.median(ratios[t]), 3),
                }
                for t in fills
            }
    finally:
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
