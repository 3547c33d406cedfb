"""Training ranks that read their share of a log against ranks that each read all of it: each rank's
peak RSS, the wall time and the test figure of one job per setting, run one after another on this box.

    .venv/bin/python -m bench.scale.gen_log --rows 5000000 --out runs/log5m
    .venv/bin/python -m bench.scale.rank_shares --data runs/log5m/parquet --settings 1 2:all 2 4 \
        --set train.max_minutes=1.0 --out runs/rank_shares.json

A setting is a rank count, with `:all` for ranks that each read the whole log (the default before
`data.share_by_user`). One rank runs without torchrun. Every rank logs its own peak RSS when it ends
(training/__main__.py); the job's metrics.json gives the test figure, the users it covers and rank 0's
peak at the end of each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.servers import ROOT, free_port

PEAK = re.compile(r"rank (\d+) of \d+ finished, peak RSS ([\d.]+) GB")


def run(setting: str, *, data: Path, config: Path, sets: list[str], out: Path, log: Path | None) -> dict[str, Any]:
    """One job of `setting` into `out`; its output (every rank's log) kept in `log` when given."""
    ranks, _, mode = setting.partition(":")
    world, share = int(ranks), mode != "all"
    job = [*("-m", "training", "train", "--config", str(config), "--data", str(data), "--out", str(out))]
    for s in [*sets, f"data.share_by_user={'true' if share else 'false'}"]:
        job += ["--set", s]
    if world == 1:
        cmd = [sys.executable, *job]
    else:
        port = str(free_port())
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", ranks, "--master-port", port, *job]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    if log is not None:
        log.write_text(text)
    if proc.returncode != 0:
        raise RuntimeError(f"{setting}: exited {proc.returncode}: {text[-3000:]}")
    peaks = {int(r): float(gb) for r, gb in PEAK.findall(text)}  # every rank logs its own when it ends
    (folder,) = [Path(line) for line in proc.stdout.splitlines() if line.strip() and Path(line).is_dir()]
    metrics = json.loads((folder / "metrics.json").read_text())
    data_info = json.loads((folder / "manifest.json").read_text())["data"]
    return {
        "ranks": world,
        "reads": "its share" if share and world > 1 else "the whole log",
        "wall_s": round(wall, 1),
        "peak_rss_gb_by_rank": [round(peaks[r], 2) for r in sorted(peaks)],
        "test_ndcg10": metrics["test"]["full"]["NDCG@10"],
        "test_users": metrics["protocol"]["test_users"],
        "epochs_run": metrics["epochs_run"],
        "seconds": metrics["seconds"],
        "rank0_peak_rss_gb_at_the_end_of": metrics.get("peak_rss_gb"),
        "artifact_users": data_info["users"],
        "artifact_interactions": data_info["interactions"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a CSV or Parquet log (a folder of parts)")
    ap.add_argument("--config", type=Path, default=ROOT / "training" / "configs" / "sasrec_beauty.toml")
    ap.add_argument("--settings", nargs="+", default=["1", "2:all", "2", "4"], help="N or N:all, in order")
    ap.add_argument("--set", nargs="*", default=[], dest="sets", help="config overrides for every job")
    ap.add_argument("--out", type=Path, default=None, help="JSON report; each job's output beside it (.N.log)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rank-shares-") as tmp:
        for n, setting in enumerate(args.settings):
            log = args.out.with_suffix(f".{n}.log") if args.out else None
            row = run(setting, data=args.data, config=args.config, sets=args.sets, out=Path(tmp) / str(n), log=log)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    report = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "rows": rows}
    print("| ranks | reads | wall s | peak RSS by rank (GB) | test NDCG@10 (users) | epochs |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        users = f"{r['test_users']['scored']:,} of {r['test_users']['of']:,}"
        peaks = " / ".join(f"{p:.2f}" for p in r["peak_rss_gb_by_rank"])
        print(
            f"| {r['ranks']} | {r['reads']} | {r['wall_s']} | {peaks} | {r['test_ndcg10']:.4f} ({users}) "
            f"| {r['epochs_run']} |"
        )
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
