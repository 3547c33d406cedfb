"""Does a retrain slow the api beside it? By-user POST /recommend under load, in windows alternated between
three conditions: the api alone; beside a warm retrain run as the retrainer runs it (niced, one training
thread: SEQSERVE_RETRAIN_NICE, SEQSERVE_RETRAIN_THREADS); beside the same job unbounded (torch's default
threads, not niced).

    .venv/bin/python -m bench.production.retrain_beside --artifacts artifacts --model sasrec-ml100k \
        --data ../shared/data/ml-100k/ml-100k.inter --concurrency 16 --seconds 10 --rounds 3

Each job starts --lead seconds before its window (past its start-up and data, into the training loop) and
is killed after it; its CPU over the window is reported beside the api's figures. The conditions' order
rotates every round, so a drift of the machine falls on each alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.servers import ROOT, free_port, start_server, stop
from bench.serving.loadgen import bodies_for, drive, group_cpu_seconds
from models.artifact import latest_versions

CONDITIONS = ("alone", "retrainer", "unbounded")


def start_job(
    condition: str, *, version: Path, data: Path, out: Path, nice: int, threads: int
) -> subprocess.Popen[bytes]:
    """The warm job a retrain runs, with a budget longer than any window (it is killed after its window)."""
    cmd = [sys.executable, "-m", "training", "warm", "--artifact", str(version), "--data", str(data)]
    cmd += ["--minutes", "30", "--out", str(out)]
    bounded = condition == "retrainer"
    if bounded:
        cmd += ["--set", f"train.threads={threads}"]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its CPU is read as its session's
        preexec_fn=(lambda: os.nice(nice)) if bounded else None,
    )


def window(condition: str, url: str, bodies: list[dict], args: argparse.Namespace, version: Path, work: Path) -> dict:
    job = None
    if condition != "alone":
        job = start_job(condition, version=version, data=args.data, out=work, nice=args.nice, threads=args.threads)
        time.sleep(args.lead)
    cpu0 = group_cpu_seconds(job.pid) if job else 0.0
    got = drive(url, bodies, args.concurrency, args.seconds, args.warmup)
    got["job_cores"] = round((group_cpu_seconds(job.pid) - cpu0) / (args.seconds + args.warmup), 2) if job else 0.0
    if job is not None:
        job.kill()
        job.wait()
    return got


def summary(runs: dict[str, list[dict]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    alone = runs["alone"]
    for condition, got in runs.items():
        row: dict[str, Any] = {}
        for key in ("rps", "p50_ms", "p99_ms", "job_cores"):
            values = [g[key] for g in got]
            row[key] = {
                "median": round(statistics.median(values), 2),
                "min": round(min(values), 2),
                "max": round(max(values), 2),
            }
        for key in ("rps", "p99_ms"):  # per round, against the api alone in the same round
            ratios = [g[key] / a[key] for g, a in zip(got, alone, strict=True)]
            row[f"{key}_vs_alone"] = {
                "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
            }
        row["errors"] = sum(g["errors"] for g in got)
        out[condition] = row
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    p.add_argument("--model", default="sasrec-ml100k")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/ml-100k/ml-100k.inter")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--lead", type=float, default=8.0, help="seconds a job runs before its window")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nice", type=int, default=10, help="SEQSERVE_RETRAIN_NICE")
    p.add_argument("--threads", type=int, default=1, help="SEQSERVE_RETRAIN_THREADS")
    p.add_argument("--workers", type=int, default=1, help="the api's SEQSERVE_WORKERS")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "retrain_beside.json")
    args = p.parse_args()
    version = latest_versions(args.artifacts)[args.model]
    bodies = bodies_for(args.artifacts, args.model)
    port = args.port or free_port()
    runs: dict[str, list[dict]] = {c: [] for c in CONDITIONS}
    with tempfile.TemporaryDirectory() as tmp:
        env = {"SEQSERVE_HISTORY_PATH": str(Path(tmp) / "h.sqlite3"), "SEQSERVE_STATE_DIR": str(Path(tmp) / "state")}
        server = start_server(args.artifacts, port, env, workers=args.workers)
        try:
            for r in range(args.rounds):
                for condition in CONDITIONS[r % 3 :] + CONDITIONS[: r % 3]:
                    got = window(
                        condition, f"http://127.0.0.1:{port}/recommend", bodies, args, version, Path(tmp) / "out"
                    )
                    runs[condition].append(got)
                    print(
                        f"round {r + 1} {condition}: {got['rps']:.0f} req/s, p99 {got['p99_ms']:.1f} ms,"
                        f" job {got['job_cores']} cores",
                        file=sys.stderr,
                    )
        finally:
            stop(server)
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "args": {k: str(v) for k, v in vars(args).items()},
        "conditions": summary(runs),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["conditions"], indent=2))


if __name__ == "__main__":
    main()
