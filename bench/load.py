"""Load benchmark: the service on loopback under N concurrent clients, three modes side by side.

    .venv/bin/python bench/load.py --artifacts artifacts --models sasrec-ml100k sasrec-beauty \
        --concurrency 1 16 64 --seconds 10

Modes, each in a fresh server process with every model of --artifacts loaded:
  noop       POST /bench/noop with the same JSON body (parsing, validation, response): the ceiling
  unbatched  POST /recommend, SEQSERVE_BATCHING=false (one model call per request)
  batched    POST /recommend, dynamic micro-batching on
The load generator is a separate process: asyncio workers with one keep-alive connection each,
writing pre-encoded HTTP/1.1 requests (--client httpx for the httpx2 client instead); every run
is bounded by --seconds and stops by itself. Only loopback is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2 as httpx

ROOT = Path(__file__).resolve().parent.parent


def start_server(artifacts: Path, port: int, env_extra: dict[str, str], *, loop: str = "auto",
                 http: str = "auto", workers: int = 1) -> subprocess.Popen[bytes]:
    # MALLOC_ARENA_MAX as scripts/serve.sh sets it.
    env = {**os.environ, "SEQSERVE_ARTIFACTS_DIR": str(artifacts), "SEQSERVE_BENCH_ENDPOINTS": "true",
           "SEQSERVE_LOG_LEVEL": "WARNING", "MALLOC_ARENA_MAX": "2", **env_extra}
    proc = subprocess.Popen(
        [str(ROOT / ".venv/bin/uvicorn"), "--factory", "app.main:app_from_env", "--host", "127.0.0.1",
         "--port", str(port), "--no-access-log", "--log-level", "warning", "--loop", loop, "--http", http,
         "--workers", str(workers)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not become ready in 120 s")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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


async def drive(url: str, bodies: list[dict], concurrency: int, seconds: float, warmup: float,
                client_kind: str = "raw") -> dict:
    """N workers, each with its own keep-alive connection, posting back to back for `seconds`.

    The raw client writes pre-encoded requests on asyncio streams: a few microseconds per request,
    so on a 2-core box the generator leaves the server most of a core (httpx2 costs several times more).
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
        return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload

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

    if client_kind == "raw":
        await asyncio.gather(*[raw_worker(i) for i in range(concurrency)])
    else:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:
            await asyncio.gather(*[httpx_worker(client, i) for i in range(concurrency)])
    lat.sort()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")

    return {"rps": len(lat) / seconds, "p50_ms": pct(0.50), "p95_ms": pct(0.95), "p99_ms": pct(0.99),
            "ok": len(lat), "errors": errors}


def bodies_for(artifacts: Path, model: str, n: int = 2000) -> list[dict]:
    folder = sorted(p for p in (artifacts / model).iterdir() if not p.name.startswith("."))[-1]
    users = json.loads((folder / "users.json").read_text())["ids"]
    rng = random.Random(0)
    return [{"model": model, "queries": [{"user_id": rng.choice(users), "k": 10}]} for _ in range(n)]


def batch_histogram(port: int) -> str:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    counts = {ln.split("{")[1].split('"')[1]: float(ln.split()[-1]) for ln in text.splitlines()
              if ln.startswith("seqserve_batch_size_count{")}
    sums = {ln.split("{")[1].split('"')[1]: float(ln.split()[-1]) for ln in text.splitlines()
            if ln.startswith("seqserve_batch_size_sum{")}
    return ", ".join(f"{m}: {sums[m] / counts[m]:.1f}" for m in counts if counts[m])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    p.add_argument("--models", nargs="+", required=True)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "load.json")
    p.add_argument("--client", choices=["raw", "httpx"], default="raw")
    p.add_argument("--modes", nargs="+", default=["noop", "unbatched", "batched"])
    # auto = uvloop and httptools (pinned dependencies); asyncio / h11 to measure without them.
    p.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto")
    p.add_argument("--http", choices=["auto", "h11", "httptools"], default="auto")
    p.add_argument("--workers", type=int, default=1, help="server processes (SEQSERVE_WORKERS)")
    p.add_argument("--env", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra server settings, e.g. SEQSERVE_MAX_WAIT_MS=1")
    args = p.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.env)
    store_dir = tempfile.mkdtemp(prefix="seqserve-bench-")
    modes = {
        "noop": ("/bench/noop", {"SEQSERVE_BATCHING": "true"}),
        "unbatched": ("/recommend", {"SEQSERVE_BATCHING": "false"}),
        "batched": ("/recommend", {"SEQSERVE_BATCHING": "true"}),
    }
    results: dict = {"rows": []}
    results["settings"] = {"torch_threads": args.torch_threads, "client": args.client, "loop": args.loop,
                           "http": args.http, "workers": args.workers, **extra}
    for mode, (path, env) in modes.items():
        if mode not in args.modes:
            continue
        env = {**env, "SEQSERVE_TORCH_THREADS": str(args.torch_threads),
               "SEQSERVE_HISTORY_PATH": f"{store_dir}/{mode}.sqlite3", **extra}
        if args.workers > 1:
            env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="seqserve-metrics-")
        proc = start_server(args.artifacts, args.port, env, loop=args.loop, http=args.http, workers=args.workers)
        try:
            results.setdefault("rss_mb", {})[mode] = round(rss_mb(proc.pid), 1)
            for model in args.models:
                bodies = bodies_for(args.artifacts, model)
                for c in args.concurrency:
                    url = f"http://127.0.0.1:{args.port}{path}"
                    r = asyncio.run(drive(url, bodies, c, args.seconds, args.warmup, args.client))
                    row = {"mode": mode, "model": model, "concurrency": c, **r}
                    results["rows"].append(row)
                    print(json.dumps(row), flush=True)
            if mode == "batched":
                results["mean_batch_size"] = batch_histogram(args.port)
            results["rss_mb"][mode + "_after"] = round(rss_mb(proc.pid), 1)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print_table(results)


def print_table(results: dict) -> None:
    rows = results["rows"]
    key = {(r["mode"], r["model"], r["concurrency"]): r for r in rows}
    print("\n| model | conc. | noop req/s | unbatched req/s | batched req/s | batched/noop | batched/unbatched "
          "| p99 ms noop / unbatched / batched |")
    print("|---|---|---|---|---|---|---|---|")
    for model in dict.fromkeys(r["model"] for r in rows):
        for c in dict.fromkeys(r["concurrency"] for r in rows):
            n, u, b = (key.get((m, model, c)) for m in ("noop", "unbatched", "batched"))
            if not (n and u and b):
                continue
            print(f"| {model} | {c} | {n['rps']:.0f} | {u['rps']:.0f} | {b['rps']:.0f} | {b['rps'] / n['rps']:.2f} "
                  f"| {b['rps'] / u['rps']:.2f} | {n['p99_ms']:.1f} / {u['p99_ms']:.1f} / {b['p99_ms']:.1f} |")
    print(f"\nresident memory (MB): {results['rss_mb']}; mean batch size (batched run): "
          f"{results.get('mean_batch_size')}")


if __name__ == "__main__":
    sys.exit(main())
