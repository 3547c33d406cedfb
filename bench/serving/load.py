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
import json
import subprocess
import tempfile
import time
from pathlib import Path

from bench.servers import ROOT, pause, rss_mb, start_server, stop
from bench.serving.loadgen import (
    alternate,
    batch_histogram,
    bodies_for,
    drive,
    group_cpu_seconds,
    start_litserve,
    start_raw,
)

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
