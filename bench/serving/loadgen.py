"""The load generator the serving benchmarks share: start the servers a benchmark compares (the
service's own are in bench/servers.py, the peers' here), drive one with N concurrent keep-alive
clients for a bounded time or alternate several in windows, and read what the machine spent.
Commands: bench/serving/load.py, compare.py; bench/production/ and bench/scale/ use it too."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx2 as httpx

from bench.servers import ROOT, log_file, pause, uvicorn_process, wait_ready


def start_raw(port: int, *, loop: str = "auto", http: str = "auto", workers: int = 1) -> subprocess.Popen[bytes]:
    """The ceiling: bench/serving/raw_asgi.py under uvicorn with the service's loop, parser and worker count."""
    proc = uvicorn_process(
        ["bench.serving.raw_asgi:app"],
        port,
        loop=loop,
        http=http,
        workers=workers,
        root=ROOT,
        env=None,
    )
    return wait_ready(proc, f"http://127.0.0.1:{port}/readyz")


def start_litserve(
    artifacts: Path,
    port: int,
    model: str,
    *,
    torch_threads: int,
    api_servers: int = 1,
    workers: int = 1,
    fast_queue: bool = False,
) -> subprocess.Popen[bytes]:
    """The peer: the same artifact through the project's engine, served by LitServe
    (bench/serving/litserve_server.py)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2"}
    proc = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/python"),
            str(ROOT / "bench" / "serving" / "litserve_server.py"),
            "--artifacts",
            str(artifacts),
            "--model",
            model,
            "--port",
            str(port),
            "--torch-threads",
            str(torch_threads),
            "--api-servers",
            str(api_servers),
            "--workers",
            str(workers),
            *(["--fast-queue"] if fast_queue else []),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log_file(),
        start_new_session=True,
    )
    return wait_ready(proc, f"http://127.0.0.1:{port}/health")


async def _raw_post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    """One HTTP/1.1 keep-alive exchange on an open connection; returns the status code."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
            break
    await reader.readexactly(length)
    return status


async def _measure(
    url: str,
    bodies: list[dict],
    concurrency: int,
    seconds: float,
    warmup: float,
    client_kind: str = "raw",
    api_key: str | None = None,
) -> tuple[list[float], int, tuple[int, int]]:
    """N workers, each with its own keep-alive connection, posting back to back for `seconds`.

    The raw client writes pre-encoded requests on asyncio streams: a few microseconds per request,
    so on a 2-core box the generator leaves the server most of a core (httpx2 costs several times more).
    Returns the latencies of the requests answered 200 in the measured window, the error count, and the
    machine's (busy, total) clock ticks from the end of the warm-up to the last answer.
    """
    lat: list[float] = []
    errors = 0
    t_start = time.perf_counter()
    t_measure = t_start + warmup
    t_end = t_measure + seconds
    host, port_path = url.split("://", 1)[1].split(":", 1)
    port, path = int(port_path.split("/", 1)[0]), "/" + port_path.split("/", 1)[1]

    def encode(body: dict) -> bytes:
        payload = json.dumps(body, separators=(",", ":")).encode()
        return (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            + (f"X-API-Key: {api_key}\r\n" if api_key else "")
            + f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload

    encoded = [encode(b) for b in bodies]

    async def raw_worker(seed: int) -> None:
        nonlocal errors
        rng = random.Random(seed)
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while True:
                t0 = time.perf_counter()
                if t0 >= t_end:
                    return
                status = await _raw_post(reader, writer, rng.choice(encoded))
                t1 = time.perf_counter()
                if t0 >= t_measure:
                    if status == 200:
                        lat.append(t1 - t0)
                    else:
                        errors += 1
        finally:
            writer.close()

    async def httpx_worker(client: httpx.AsyncClient, seed: int) -> None:
        nonlocal errors
        rng = random.Random(seed)
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                return
            r = await client.post(url, json=rng.choice(bodies))
            t1 = time.perf_counter()
            if t0 >= t_measure:
                if r.status_code == 200:
                    lat.append(t1 - t0)
                else:
                    errors += 1

    start: tuple[int, int] = (0, 0)

    async def mark_start() -> None:
        nonlocal start
        await asyncio.sleep(max(0.0, t_measure - time.perf_counter()))
        start = machine_jiffies()

    if client_kind == "raw":
        await asyncio.gather(mark_start(), *[raw_worker(i) for i in range(concurrency)])
    else:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        keyed = {"X-API-Key": api_key} if api_key else {}
        async with httpx.AsyncClient(limits=limits, timeout=30, headers=keyed) as client:
            await asyncio.gather(mark_start(), *[httpx_worker(client, i) for i in range(concurrency)])
    end = machine_jiffies()
    return lat, errors, (end[0] - start[0], end[1] - start[1])


def _measure_in_process(
    url: str,
    bodies: list[dict],
    concurrency: int,
    seconds: float,
    warmup: float,
    client_kind: str,
    api_key: str | None = None,
) -> tuple[list[float], int, tuple[int, int]]:
    return asyncio.run(_measure(url, bodies, concurrency, seconds, warmup, client_kind, api_key))


def drive(
    url: str,
    bodies: list[dict],
    concurrency: int,
    seconds: float,
    warmup: float,
    *,
    client_kind: str = "raw",
    procs: int = 1,
) -> dict:
    """`concurrency` connections spread over `procs` generator processes; req/s and latency percentiles.

    One asyncio process uses at most one core; on a many-core host serving with several workers, more
    processes keep the generator from being the ceiling. Each process measures its own `seconds`
    after its own warm-up: process start-up staggers those windows by a fraction of the warm-up.
    """
    lat, errors, _ = collect(url, bodies, concurrency, seconds, warmup, client_kind=client_kind, procs=procs)
    return summarize(lat, errors, seconds)


def collect(
    url: str,
    bodies: list[dict],
    concurrency: int,
    seconds: float,
    warmup: float,
    *,
    client_kind: str = "raw",
    procs: int = 1,
    api_key: str | None = None,
) -> tuple[list[float], int, tuple[int, int]]:
    """drive()'s measurement: the latencies (seconds) of the requests answered 200, the error count, and
    the machine's (busy, total) clock ticks over the measured span (the first generator process's span:
    the machine is one, whatever the number of processes). `api_key`: sent as X-API-Key with each request."""
    procs = max(1, min(procs, concurrency))
    if procs == 1:
        return _measure_in_process(url, bodies, concurrency, seconds, warmup, client_kind, api_key)
    else:
        shares = [concurrency // procs + (i < concurrency % procs) for i in range(procs)]
        with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [
                pool.submit(_measure_in_process, url, bodies[i::procs], n, seconds, warmup, client_kind, api_key)
                for i, n in enumerate(shares)
            ]
            parts = [f.result() for f in futures]
        lat = [x for part, _, _ in parts for x in part]
        errors = sum(e for _, e, _ in parts)
    return lat, errors, parts[0][2]


def alternate(
    targets: dict[str, tuple[subprocess.Popen[bytes], str]],
    bodies: list[dict],
    concurrency: int,
    *,
    rounds: int,
    seconds: float,
    warmup: float,
    client_kind: str = "raw",
    procs: int = 1,
    api_key: str | None = None,
) -> dict[str, dict]:
    """Servers taking turns: `rounds` windows of seconds/rounds each per target (name -> (server, URL)),
    the order flipped every round, each server paused outside its windows. -> name -> summary, with
    the machine's busy cores and CPU per request over that target's windows."""
    got: dict[str, tuple[list[float], int, list[int]]] = {name: ([], 0, [0, 0]) for name in targets}
    names = list(targets)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            proc, url = targets[name]
            pause(proc, False)
            try:
                lat, errors, ticks = collect(
                    url,
                    bodies,
                    concurrency,
                    seconds / rounds,
                    warmup,
                    client_kind=client_kind,
                    procs=procs,
                    api_key=api_key,
                )
            finally:
                pause(proc, True)
            old_lat, old_errors, busy = got[name]
            got[name] = (old_lat + lat, old_errors + errors, [busy[0] + ticks[0], busy[1] + ticks[1]])
    out = {}
    for name, (lat, errors, busy) in got.items():
        summary = summarize(lat, errors, seconds)
        out[name] = {**summary, **cpu_share(busy, summary["ok"], seconds)}
    return out


def cpu_share(ticks: list[int], answered: int, seconds: float) -> dict:
    """The machine's busy cores over measured windows, and its CPU microseconds per answered request
    (everything on the machine: server, load generator, kernel)."""
    if not ticks[1]:
        return {}
    cores = os.cpu_count() or 1
    busy_cores = ticks[0] / ticks[1] * cores
    return {
        "busy_cores": round(busy_cores, 2),
        "cpu_us_per_request": round(busy_cores * seconds / answered * 1e6) if answered else None,
    }


def summarize(lat: list[float], errors: int, seconds: float) -> dict:
    lat = sorted(lat)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")

    return {
        "rps": len(lat) / seconds,
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "ok": len(lat),
        "errors": errors,
    }


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) clock ticks over every core since boot, from /proc/stat (idle and iowait are not busy)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def group_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of every process in `pid`'s session (a server and the workers it forked)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == pid:  # the session id (servers are started with start_new_session)
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def bodies_for(artifacts: Path, model: str, n: int = 2000) -> list[dict]:
    from models.artifact import latest_versions
    from models.history_table import HistoryTable

    table = HistoryTable(latest_versions(artifacts)[model] / "histories")
    rng = random.Random(0)
    rows = [rng.randrange(len(table)) for _ in range(n)]
    return [{"model": model, "queries": [{"user_id": table.user(r), "k": 10}]} for r in rows]


def batch_histogram(port: int) -> str:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    counts = {
        ln.split("{")[1].split('"')[1]: float(ln.split()[-1])
        for ln in text.splitlines()
        if ln.startswith("seqserve_batch_size_count{")
    }
    sums = {
        ln.split("{")[1].split('"')[1]: float(ln.split()[-1])
        for ln in text.splitlines()
        if ln.startswith("seqserve_batch_size_sum{")
    }
    return ", ".join(f"{m}: {sums[m] / counts[m]:.1f}" for m in counts if counts[m])
