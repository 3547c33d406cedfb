"""By-user reads while writes wait for a replica that is not there: `/recommend` latency for users nobody
writes, with and without a dozen writers whose every event waits the whole SEQSERVE_REDIS_WAIT_MS (a primary
without a replica and SEQSERVE_REDIS_WAIT_REPLICAS=1), for this checkout and another (`--root`).

    git worktree add ../head HEAD && ln -s "$PWD/.venv" ../head/.venv
    .venv/bin/python -m bench.scale.wait_stall --artifacts runs/replay-work/arts --root ../head [--rounds 2]

One standalone redis-server on loopback (it has no replica, so every WAIT times out); the service with one
worker, started from each checkout in turn (alternated). Reads: one client, one query of a user from the
artifact (`--users`, never written) per request, for `--seconds`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from bench.scale.redis_cluster import one_server
from bench.servers import ROOT, free_port, start_server, stop


def reads(url: str, users: list[str], seconds: float) -> list[float]:
    """Milliseconds of each by-user request, one after another, for `seconds`."""
    out = []
    with httpx.Client(timeout=30) as c:
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            body = {"queries": [{"user_id": users[n % len(users)], "k": 10}]}
            t = time.perf_counter()
            r = c.post(f"{url}/recommend", json=body)
            out.append((time.perf_counter() - t) * 1e3)
            if r.status_code != 200:
                raise RuntimeError(f"/recommend answered {r.status_code}: {r.text[:200]}")
            n += 1
    return out


def writers(url: str, count: int, stop_at: float) -> list[threading.Thread]:
    """`count` threads posting one event each, again and again, until `stop_at` (each waits, then 503)."""

    def run(k: int) -> None:
        with httpx.Client(timeout=30) as c:
            n = 0
            while time.monotonic() < stop_at:
                ev = {"event_id": f"w{k}-{n}", "user_id": f"writer{k}", "item_id": "50", "timestamp": 8.9e8}
                c.post(f"{url}/events", json={"events": [ev]})
                n += 1

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(count)]
    for t in threads:
        t.start()
    return threads


def one(root: Path, artifacts: Path, redis_url: str, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    env = {
        "SEQSERVE_HISTORY_STORE": "redis",
        "SEQSERVE_REDIS_URL": redis_url,
        "SEQSERVE_REDIS_WAIT_REPLICAS": "1",
        "SEQSERVE_REDIS_WAIT_MS": str(args.wait_ms),
        "SEQSERVE_TORCH_THREADS": "1",
    }
    proc = start_server(artifacts, port, env, root=root)
    url = f"http://127.0.0.1:{port}"
    try:
        reads(url, args.users, 1.0)  # warm
        alone = reads(url, args.users, args.seconds)
        stop_at = time.monotonic() + args.seconds + args.wait_ms / 1e3 + 1
        threads = writers(url, args.writers, stop_at)
        time.sleep(args.wait_ms / 1e3 / 2)  # the writers' first events are in their WAIT
        stalled = reads(url, args.users, args.seconds)
        for t in threads:
            t.join()
    finally:
        stop(proc)

    def summary(ms: list[float]) -> dict[str, float]:
        q = statistics.quantiles(ms, n=100)
        return {"n": len(ms), "p50_ms": round(q[49], 2), "p99_ms": round(q[98], 2), "max_ms": round(max(ms), 2)}

    return {"alone": summary(alone), "with_writers": summary(stalled)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifacts", type=Path, required=True)
    p.add_argument("--root", type=Path, required=True, help="the other checkout (the code before a change)")
    p.add_argument("--users", nargs="+", default=["196", "186", "22", "244", "166", "298"])
    p.add_argument("--writers", type=int, default=12)
    p.add_argument("--wait-ms", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    artifacts = args.artifacts.resolve()
    proc, redis_url = one_server(Path(tempfile.mkdtemp(prefix="wait-stall-")) / "redis")
    rounds: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            for name, root in (("this", ROOT), ("other", args.root.resolve())):
                got = one(root, artifacts, redis_url, args)
                print(json.dumps({"round": r, "checkout": name, **got}), flush=True)
                rounds.append({"round": r, "checkout": name, **got})
    finally:
        proc.terminate()
    machine = f"{platform.node()} {platform.processor() or platform.machine()}"
    report: dict[str, Any] = {"machine": machine, "args": vars(args), "rounds": rounds}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
