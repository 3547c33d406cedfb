"""Variants of the service side by side on a noisy machine: all started at once, alternated in windows.

    git worktree add ../head HEAD && ln -s "$PWD/.venv" ../head/.venv     # the code before a change
    .venv/bin/python -m bench.serving.compare --models sasrec-ml100k --concurrency 1 16 64 --rounds 6 --seconds 15 \\
        --variant head:root=../head --variant new
    .venv/bin/python -m bench.serving.compare --models sasrec-ml100k --variant w1:workers=1 --variant w2:workers=2 \\
        --variant w4:workers=4 --paths /recommend

A variant is NAME[:KEY=VALUE,...]: root= a checkout whose .venv and code serve it (default: this one),
workers= server processes, http= uvicorn's own parser (httptools, h11) through its command line instead
of the service's launcher and its connection limits, any other KEY=VALUE an environment setting.
Every variant's server is up for the whole run; for each path and concurrency the variants take turns
in --rounds windows of --seconds/--rounds each (the order flips every round), and a server outside
its window is paused (SIGSTOP), so slow drift of a shared machine falls on every variant alike.
Req/s and percentiles are over all of a variant's windows; the ratio is against the first variant.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench.servers import ROOT, free_port, pause, start_server, stop
from bench.serving.loadgen import alternate, bodies_for


def parse_variant(spec: str) -> tuple[str, Path, int, str, dict[str, str]]:
    name, _, rest = spec.partition(":")
    settings = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    root = Path(settings.pop("root", ROOT)).resolve()
    workers = int(settings.pop("workers", "1"))
    http = settings.pop("http", "auto")
    return name, root, workers, http, settings


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    p.add_argument("--models", nargs="+", required=True)
    p.add_argument("--variant", action="append", required=True, metavar="NAME[:KEY=VALUE,...]")
    p.add_argument("--paths", nargs="+", default=["/bench/noop", "/recommend"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds per variant and point")
    p.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds at the start of each window")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--port", type=int, default=8900, help="the first variant's, the others' follow; 0: any free ones")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "compare.json")
    p.add_argument("--api-key", help="sent as X-API-Key with every request (a variant whose by-user reads need one)")
    args = p.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    procs = {}
    rows = []
    try:
        for i, (name, root, workers, http, settings) in enumerate(variants):
            env = {
                "SEQSERVE_TORCH_THREADS": str(args.torch_threads),
                "SEQSERVE_HISTORY_PATH": f"{tempfile.mkdtemp(prefix='seqserve-compare-')}/h.sqlite3",
                **settings,
            }
            if workers > 1:
                env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="seqserve-metrics-")
            procs[name] = (
                start_server(
                    args.artifacts,
                    port := args.port + i if args.port else free_port(),
                    env,
                    workers=workers,
                    root=root,
                    http=http,
                ),
                port,
            )
            pause(procs[name][0], True)
        names = [v[0] for v in variants]
        for model in args.models:
            bodies = bodies_for(args.artifacts, model)
            for path in args.paths:
                targets = {n: (procs[n][0], f"http://127.0.0.1:{procs[n][1]}{path}") for n in names}
                for c in args.concurrency:
                    res = alternate(
                        targets,
                        bodies,
                        c,
                        rounds=args.rounds,
                        seconds=args.seconds,
                        warmup=args.warmup,
                        api_key=args.api_key,
                    )
                    base = res[names[0]]["rps"] or float("nan")
                    for n in names:
                        rows.append(
                            {
                                "variant": n,
                                "model": model,
                                "path": path,
                                "concurrency": c,
                                **res[n],
                                "ratio": res[n]["rps"] / base,
                            }
                        )
                    print(
                        f"{model} {path} c={c}: "
                        + " | ".join(
                            f"{n} {res[n]['rps']:.0f} req/s, p99 {res[n]['p99_ms']:.1f} ms "
                            f"({res[n]['rps'] / base:.2f}x), "
                            f"{res[n].get('busy_cores')} cores busy, {res[n].get('cpu_us_per_request')} us CPU/request"
                            + (f", {res[n]['errors']} errors" if res[n]["errors"] else "")
                            for n in names
                        ),
                        flush=True,
                    )
    finally:
        for proc, _ in procs.values():
            stop(proc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"variants": args.variant, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
