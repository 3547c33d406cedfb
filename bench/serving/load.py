"""Load benchmark: the service on loopback under N concurrent clients, its modes side by side.

    .venv/bin/python -m bench.serving.load --artifacts artifacts --models sasrec-ml100k sasrec-beauty \
        --concurrency 1 16 64 --seconds 10

Modes, each in a fresh server process with every model of --artifacts loaded:
  noop       POST /bench/noop with the same JSON body (parsing, validation, response): the ceiling
  unbatched  POST /recommend, SEQSERVE_BATCHING=false (one model call per request)
  batched    POST /recommend, dynamic micro-batching on
  litserve   a peer, not the service: the same artifact and engine served by LitServe
             (bench/serving/litserve_server.py; `.venv/bin/pip install -e '.[bench]'` first; one --models)
  raw        the machine's ceiling, not the service: a bare ASGI app (bench/serving/raw_asgi.py) under the
             same uvicorn settings and worker count, reading the body and answering a fixed one
--interleave N starts the servers together (the no-op is an endpoint of the batched one) and alternates
them in N windows per concurrency (the order flipped every round), so a shared machine's drift falls
on every mode alike; a server
outside its window is paused (SIGSTOP), since an idle LitServe still polls (`idle_cores` in the output).
The load generator is a separate process: asyncio workers with one keep-alive connection each,
writing pre-encoded HTTP/1.1 requests (--client httpx for the httpx2 client instead); every run
is bounded by --seconds and stops by itself. Only loopback is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx2 as httpx

from bench.servers import ROOT, log_file, pause, rss_mb, start_server, stop, uvicorn_process, wait_ready


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
    from models.histories import HistoryTable

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


PATHS = {  # the path each mode's requests go to
    "raw": "/recommend",
    "noop": "/bench/noop",
    "unbatched": "/recommend",
    "batched": "/recommend",
    "litserve": "/recommend",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    p.add_argument("--models", nargs="+", required=True)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--idle-seconds", type=float, default=3.0, help="how long each idle server's CPU is read")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "load.json")
    p.add_argument("--client", choices=["raw", "httpx"], default="raw")
    p.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="load-generator processes sharing the connections (for many-core hosts)",
    )
    p.add_argument("--modes", nargs="+", default=["noop", "unbatched", "batched"])
    # auto = uvloop and httptools (pinned dependencies); asyncio / h11 to measure without them.
    p.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto")
    p.add_argument("--http", choices=["auto", "h11", "httptools"], default="auto")
    p.add_argument("--workers", type=int, default=1, help="server processes (SEQSERVE_WORKERS)")
    p.add_argument(
        "--env", nargs="*", default=[], metavar="KEY=VALUE", help="extra server settings, e.g. SEQSERVE_MAX_WAIT_MS=1"
    )
    p.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="keep every mode's server up at once and alternate them, ROUNDS windows of "
        "--seconds/ROUNDS each per concurrency: drift of a shared machine then falls on "
        "every mode alike (0: one mode after another, each in a fresh server)",
    )
    p.add_argument("--litserve-api-servers", type=int, default=1, help="the peer's HTTP processes")
    p.add_argument("--litserve-workers", type=int, default=1, help="the peer's inference processes")
    p.add_argument("--litserve-fast-queue", action="store_true", help="the peer's ZeroMQ request queue")
    return p


class Run:
    """One invocation: the servers its modes need, and the rows, memory and settings it reports."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.extra = dict(kv.split("=", 1) for kv in args.env)
        self.store_dir = tempfile.mkdtemp(prefix="seqserve-bench-")
        self.wanted = [m for m in PATHS if m in args.modes]
        if "litserve" in self.wanted and len(args.models) != 1:
            raise SystemExit("litserve mode serves one model: pass one --models")
        self.results: dict = {"rows": [], "rss_mb": {}}
        self.results["settings"] = {
            "torch_threads": args.torch_threads,
            "client": args.client,
            "client_procs": args.client_procs,
            "loop": args.loop,
            "http": args.http,
            "workers": args.workers,
            "interleave": args.interleave,
            "litserve": {
                "api_servers": args.litserve_api_servers,
                "workers": args.litserve_workers,
                "fast_queue": args.litserve_fast_queue,
            },
            **self.extra,
        }

    def start(self, server: str, port: int) -> subprocess.Popen[bytes]:
        """One server: "batched" (which also serves the no-op), "unbatched", the "litserve" peer or "raw"."""
        args = self.args
        if server == "raw":
            return start_raw(port, loop=args.loop, http=args.http, workers=args.workers)
        if server == "litserve":
            return start_litserve(
                args.artifacts,
                port,
                args.models[0],
                torch_threads=args.torch_threads,
                api_servers=args.litserve_api_servers,
                workers=args.litserve_workers,
                fast_queue=args.litserve_fast_queue,
            )
        env = {
            "SEQSERVE_BATCHING": "false" if server == "unbatched" else "true",
            "SEQSERVE_TORCH_THREADS": str(args.torch_threads),
            "SEQSERVE_HISTORY_PATH": f"{self.store_dir}/{server}-{port}.sqlite3",
            **self.extra,
        }
        if args.workers > 1:
            env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="seqserve-metrics-")
        return start_server(args.artifacts, port, env, loop=args.loop, http=args.http, workers=args.workers)

    @staticmethod
    def server_of(mode: str) -> str:
        return "batched" if mode == "noop" else mode

    def record(self, mode: str, model: str, c: int, r: dict) -> None:
        row = {"mode": mode, "model": model, "concurrency": c, **r}
        self.results["rows"].append(row)
        print(json.dumps(row), flush=True)

    def interleaved(self) -> None:
        """Every mode's server up at once, the modes alternated in windows (--interleave)."""
        args, results, wanted = self.args, self.results, self.wanted
        servers = list(dict.fromkeys(self.server_of(m) for m in wanted))
        ports = {srv: args.port + i for i, srv in enumerate(servers)}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for srv in servers:
                procs[srv] = self.start(srv, ports[srv])
                results["rss_mb"][srv] = round(rss_mb(procs[srv].pid), 1)
            # What the idle servers cost the measured one: each server's CPU over a while with no load.
            before = {srv: group_cpu_seconds(proc.pid) for srv, proc in procs.items()}
            time.sleep(args.idle_seconds)
            results["idle_cores"] = {
                srv: round((group_cpu_seconds(proc.pid) - before[srv]) / args.idle_seconds, 3)
                for srv, proc in procs.items()
            }
            for proc in procs.values():
                pause(proc, True)
            for model in args.models:
                bodies = bodies_for(args.artifacts, model)
                targets = {
                    m: (procs[self.server_of(m)], f"http://127.0.0.1:{ports[self.server_of(m)]}{PATHS[m]}")
                    for m in wanted
                }
                for c in args.concurrency:
                    res = alternate(
                        targets,
                        bodies,
                        c,
                        rounds=args.interleave,
                        seconds=args.seconds,
                        warmup=args.warmup,
                        client_kind=args.client,
                        procs=args.client_procs,
                    )
                    for mode in wanted:
                        self.record(mode, model, c, res[mode])
            for proc in procs.values():
                pause(proc, False)
            if "batched" in procs:
                results["mean_batch_size"] = batch_histogram(ports["batched"])
            for srv, proc in procs.items():
                results["rss_mb"][srv + "_after"] = round(rss_mb(proc.pid), 1)
        finally:
            for proc in procs.values():
                stop(proc)

    def one_after_another(self) -> None:
        """Each mode in a fresh server of its own, in turn."""
        args, results = self.args, self.results
        for mode in self.wanted:
            proc = self.start(self.server_of(mode), args.port)
            try:
                results["rss_mb"][mode] = round(rss_mb(proc.pid), 1)
                for model in args.models:
                    bodies = bodies_for(args.artifacts, model)
                    for c in args.concurrency:
                        url = f"http://127.0.0.1:{args.port}{PATHS[mode]}"
                        measured = drive(
                            url, bodies, c, args.seconds, args.warmup, client_kind=args.client, procs=args.client_procs
                        )
                        self.record(mode, model, c, measured)
                if mode == "batched":
                    results["mean_batch_size"] = batch_histogram(args.port)
                results["rss_mb"][mode + "_after"] = round(rss_mb(proc.pid), 1)
            finally:
                stop(proc)


def main() -> None:
    args = parser().parse_args()
    run = Run(args)
    if args.interleave:
        run.interleaved()
    else:
        run.one_after_another()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(run.results, indent=1))
    print_table(run.results)


def print_table(results: dict) -> None:
    rows = results["rows"]
    key = {(r["mode"], r["model"], r["concurrency"]): r for r in rows}
    modes = [m for m in ("raw", "noop", "unbatched", "batched", "litserve") if any(r["mode"] == m for r in rows)]
    ratios = [
        (a, b)
        for a, b in (("noop", "raw"), ("batched", "noop"), ("batched", "unbatched"), ("batched", "litserve"))
        if a in modes and b in modes
    ]
    print(
        "\n| model | conc. | "
        + " | ".join(f"{m} req/s" for m in modes)
        + " | "
        + " | ".join(f"{a}/{b}" for a, b in ratios)
        + " | p99 ms "
        + " / ".join(modes)
        + " | machine CPU us per request "
        + " / ".join(modes)
        + " |"
    )
    print("|---" * (4 + len(modes) + len(ratios)) + "|")
    for model in dict.fromkeys(r["model"] for r in rows):
        for c in dict.fromkeys(r["concurrency"] for r in rows):
            got = {m: key.get((m, model, c)) for m in modes}
            if not all(got.values()):
                continue
            rps = " | ".join(f"{got[m]['rps']:.0f}" for m in modes)  # type: ignore[index]
            ratio = " | ".join(f"{got[a]['rps'] / got[b]['rps']:.2f}" for a, b in ratios)  # type: ignore[index]
            p99 = " / ".join(f"{got[m]['p99_ms']:.1f}" for m in modes)  # type: ignore[index]
            cpu = " / ".join(str(got[m].get("cpu_us_per_request", "-")) for m in modes)  # type: ignore[union-attr]
            print(f"| {model} | {c} | {rps} | {ratio} | {p99} | {cpu} |")
    print(
        f"\nresident memory (MB): {results['rss_mb']}; mean batch size (batched run): {results.get('mean_batch_size')}"
    )
    if "idle_cores" in results:
        print(f"idle servers' CPU (cores, while nothing was sent): {results['idle_cores']}")


if __name__ == "__main__":
    main()
