"""One Redis server against a Redis Cluster (three primaries, a replica each), on this box: events/s
appended through the store, alone and waiting for a replica (WAIT), then by-user `/recommend` req/s of
the service on each (bench/serving/compare.py, alternated).

    .venv/bin/python -m bench.scale.redis_cluster --models sasrec-ml100k [--seconds 4 --rounds 3 --writers 4]

Every node is a redis-server on loopback with append-only persistence fsynced on every write, as in
compose. The writers are threads of this process, each appending one event per call (what one
POST /events of one event costs the store), users drawn from 10,000; the rounds alternate the stores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from app.store import Event, RedisClusterStore, RedisStore
from bench.servers import ROOT, RedisClusterNodes, free_port


def one_server(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    data.mkdir(parents=True)
    proc = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)),
            *("--appendonly", "yes", "--appendfsync", "always", "--save", ""),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 20
    while True:
        try:
            RedisStore(url).ping()
            return proc, url
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def append_rate(store: RedisStore, *, writers: int, seconds: float, tag: str) -> dict[str, Any]:
    """Events/s of `writers` threads appending one event per call for `seconds`; each call's latency."""
    latencies: list[list[float]] = [[] for _ in range(writers)]
    errors = [0] * writers
    stop_at = time.monotonic() + seconds

    def write(w: int) -> None:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            e = Event(f"{tag}-{w}-{n}", f"u{(w * 7919 + n) % 10_000}", f"i{n % 1000}", float(n))
            t = time.perf_counter()
            try:
                store.append("bench", [e])
            except Exception:
                errors[w] += 1
                continue
            latencies[w].append(time.perf_counter() - t)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = sorted(x for lat in latencies for x in lat)
    return {
        "events_per_s": round(len(every) / seconds),
        "p50_ms": round(1000 * every[len(every) // 2], 3) if every else None,
        "p99_ms": round(1000 * every[int(len(every) * 0.99)], 3) if every else None,
        "errors": sum(errors),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    p.add_argument("--models", nargs="+", required=True, help="served by the req/s comparison")
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--seconds", type=float, default=4.0, help="each store's window per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, nargs="+", default=[16])
    p.add_argument(
        "--compare-seconds", type=float, default=30.0, help="compare.py's measured seconds a variant; 0: appends only"
    )
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "redis_cluster.json")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="redis-cluster-"))
    cli = shutil.which("redis-cli")
    binary = shutil.which("redis-server")
    if cli is None or binary is None:
        sys.exit("needs redis-server and redis-cli")
    proc, url = one_server(work / "one")
    nodes = RedisClusterNodes(work / "cluster", binary=binary, cli=cli).start()
    report: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    try:
        stores: dict[str, RedisStore] = {
            "one server": RedisStore(url),
            "cluster": RedisClusterStore(nodes.url),
            "cluster, WAIT 1 replica": RedisClusterStore(nodes.url, wait_replicas=1),
        }
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in stores}
        for r in range(args.rounds):
            order = list(stores) if r % 2 == 0 else list(reversed(stores))
            for name in order:
                got = append_rate(stores[name], writers=args.writers, seconds=args.seconds, tag=f"r{r}")
                runs[name].append(got)
                print(json.dumps({"store": name, "round": r, **got}), flush=True)
        base = statistics.median(x["events_per_s"] for x in runs["one server"])
        report["events"] = {
            name: {
                "events_per_s_median": statistics.median(x["events_per_s"] for x in got),
                "events_per_s_each": [x["events_per_s"] for x in got],
                "p99_ms_median": statistics.median(x["p99_ms"] for x in got if x["p99_ms"] is not None),
                "over_one_server": round(statistics.median(x["events_per_s"] for x in got) / base, 2),
                "errors": sum(x["errors"] for x in got),
            }
            for name, got in runs.items()
        }
        for s in stores.values():
            s.close()
        if args.compare_seconds <= 0:
            return
        compared = work / "compare.json"
        cmd = [sys.executable, "-m", "bench.serving.compare", "--artifacts", str(args.artifacts)]
        cmd += ["--models", *args.models, "--paths", "/recommend", "--concurrency", *map(str, args.concurrency)]
        cmd += ["--rounds", str(2 * args.rounds), "--seconds", str(args.compare_seconds), "--port", "0"]
        cmd += ["--variant", f"one-server:SEQSERVE_HISTORY_STORE=redis,SEQSERVE_REDIS_URL={url}"]
        cmd += ["--variant", f"cluster:SEQSERVE_HISTORY_STORE=redis-cluster,SEQSERVE_REDIS_URL={nodes.url}"]
        cmd += ["--out", str(compared)]
        subprocess.run(cmd, cwd=ROOT, check=True)
        report["recommend_by_user"] = json.loads(compared.read_text())["rows"]
    finally:
        nodes.stop()
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
