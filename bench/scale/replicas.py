"""api replicas behind the compose balancer: by-user `/recommend` req/s with 1, 2, 3... replicas, and a
replica killed under load (what clients saw; whether every acknowledged event is stored).

    ../shared/tools/local-docker.sh build && ../shared/tools/local-docker.sh up   # the stack, once
    .venv/bin/python -m bench.scale.replicas --scales 1 2 3 --seconds 20 --concurrency 16 --kill

Drives a running compose project (`-p seqserve -f docker-compose.local.yml`, as local-docker.sh starts
it) through its balancer on http://127.0.0.1:8000: `docker-compose up -d --scale api=N` for each N,
waits until N replicas are healthy, then sends by-user queries of MovieLens-100k users from
--concurrency clients. With --kill, at the largest N: queries and events (each with its own id) go on
while one replica is killed with SIGKILL halfway; afterwards every event the service acknowledged is
looked for in the user's stored history.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from bench.servers import ROOT

COMPOSE = ["docker-compose", "-p", "seqserve", "-f", "docker-compose.local.yml"]
URL = "http://127.0.0.1:8000"
MODEL = "sasrec-ml100k"


def replicas() -> list[tuple[str, str]]:
    """(name, health) of each api container."""
    out = subprocess.run(
        ["docker", "ps", "--filter", "label=com.docker.compose.service=api", "--format", "{{.Names}} {{.Status}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [(line.split()[0], "healthy" if "(healthy)" in line else "other") for line in out.splitlines() if line]


def scale_to(n: int, timeout_s: float = 600) -> None:
    subprocess.run([*COMPOSE, "up", "-d", "--no-recreate", "--scale", f"api={n}"], cwd=ROOT, check=True)
    deadline = time.monotonic() + timeout_s
    while True:
        got = replicas()
        if len(got) == n and all(h == "healthy" for _, h in got):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} healthy replicas not within {timeout_s} s: {got}")
        time.sleep(1)
    time.sleep(3)  # the balancer's checks (1 s apart, one to rise) see every replica


async def drive(seconds: float, concurrency: int, *, events: bool, kill_at: float | None) -> dict[str, Any]:
    """Queries (and events) from `concurrency` clients for `seconds`; a replica killed at `kill_at` s."""
    rng = random.Random(0)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    acked: list[tuple[str, str, str]] = []  # (user, event id, item) the service answered 200 to
    killed: list[str] = []
    stop_at = time.monotonic() + seconds
    counter = [0]

    async def client(c: int, http: httpx.AsyncClient) -> None:
        while time.monotonic() < stop_at:
            user = str(rng.randrange(1, 944))
            counter[0] += 1
            n = counter[0]
            try:
                if events and n % 4 == 0:
                    eid, item = f"replicas-{os.getpid()}-{n}", str(rng.randrange(1, 1683))
                    event = {"event_id": eid, "user_id": user, "item_id": item, "timestamp": time.time()}
                    body = {"model": MODEL, "events": [event]}
                    r = await http.post("/events", json=body)
                    if r.status_code == 200 and r.json()["results"][0]["status"] in ("stored", "duplicate"):
                        acked.append((user, eid, item))
                else:
                    t = time.perf_counter()
                    r = await http.post("/recommend", json={"model": MODEL, "queries": [{"user_id": user, "k": 10}]})
                    if r.status_code == 200:
                        latencies.append(time.perf_counter() - t)
                key = str(r.status_code)
            except httpx.HTTPError as exc:
                key = type(exc).__name__
            statuses[key] = statuses.get(key, 0) + 1

    async def killer() -> None:
        if kill_at is None:
            return
        await asyncio.sleep(kill_at)
        name = replicas()[-1][0]
        await asyncio.to_thread(subprocess.run, ["docker", "kill", "-s", "KILL", name], check=True, capture_output=True)
        killed.append(name)

    async with httpx.AsyncClient(base_url=URL, timeout=10) as http:
        began = time.monotonic()
        await asyncio.gather(killer(), *(client(c, http) for c in range(concurrency)))
        took = time.monotonic() - began
    lat = sorted(latencies)
    return {
        "rps": round(len(lat) / took, 1),
        "p50_ms": round(1000 * lat[len(lat) // 2], 2) if lat else None,
        "p99_ms": round(1000 * lat[int(len(lat) * 0.99)], 2) if lat else None,
        "statuses": statuses,
        "killed": killed,
        "acked": acked,
    }


async def stored(acked: list[tuple[str, str, str]]) -> int:
    """How many acknowledged events a user's stored history holds (GET /history, newest first)."""
    by_user: dict[str, set[str]] = {}
    for user, _, item in acked:
        by_user.setdefault(user, set()).add(item)
    found = 0
    async with httpx.AsyncClient(base_url=URL, timeout=30) as http:
        for user, items in by_user.items():
            r = await http.get("/history", params={"model": MODEL, "user_id": user, "limit": 1000})
            r.raise_for_status()
            held = {step["item_id"] for step in r.json()["events"] if step["source"] == "live"}
            found += len(items & held)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scales", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--rounds", type=int, default=2, help="each scale's windows (the order reverses each round)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--kill", action="store_true", help="then a replica killed under load at the largest scale")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "replicas.json")
    args = p.parse_args()
    report: dict[str, Any] = {"machine": f"{os.cpu_count()} cores", "scales": {}}
    for r in range(args.rounds):
        for n in args.scales if r % 2 == 0 else list(reversed(args.scales)):
            scale_to(n)
            got = asyncio.run(drive(args.seconds, args.concurrency, events=False, kill_at=None))
            got.pop("acked"), got.pop("killed")
            report["scales"].setdefault(str(n), []).append(got)
            print(json.dumps({"replicas": n, "round": r, **got}), flush=True)
    report["rps_median"] = {n: statistics.median(x["rps"] for x in runs) for n, runs in report["scales"].items()}
    if args.kill:
        top = max(args.scales)
        scale_to(top)
        got = asyncio.run(drive(args.seconds, args.concurrency, events=True, kill_at=args.seconds / 2))
        acked = got.pop("acked")
        got["events_acknowledged"] = len({(user, item) for user, _, item in acked})  # distinct (user, item)
        got["events_stored"] = asyncio.run(stored(acked))
        report["kill"] = {"replicas": top, **got}
        print(json.dumps(report["kill"]), flush=True)
        scale_to(top)  # compose starts the killed one again (restart: unless-stopped) or a new one
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
