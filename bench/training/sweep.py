"""Variants of a training config x seeds, at an equal budget: mean and spread of test metrics, with the
baselines of the same runs beside them. Each run is a normal `python -m training train` job.

    .venv/bin/python -m bench.training.sweep --config training/configs/mhsa_seed_geolife.toml \
        --data ../shared/data/geolife-staypoints/dataSet_geolife.csv --seeds 0 1 2 --parallel 2 \
        --variant "seed MHSA:" --variant "+ copy head:model.pointer=true" \
        --variant "+ new-place labels:train.novel_as_unknown=true" \
        --metric test.all.Acc@1 --metric test.all.MRR --out runs/sweep-geolife

    .venv/bin/python -m bench.training.sweep --config training/configs/social_mathoverflow.toml --seeds 1 2 3 \
        --variant "learned:model.positions='learned'" --variant "time:model.positions='time'" \
        --set train.max_minutes=2 --metric test.all.NDCG@10 --metric test.new.HR@10

A variant is "label:override;override" (overrides as `--set` takes them; none = the config as it is).
`--parallel` runs share the cores out (train.threads). Metric paths are dotted keys of metrics.json;
a baseline's row reads the same path with `test` replaced by `baselines_test.<baseline>`.
Choose on validation metrics (`valid...` paths) when a sweep decides a config; test is for reporting.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from models.artifact import latest_versions

ROOT = Path(__file__).resolve().parents[2]


def parse_variant(text: str) -> tuple[str, list[str]]:
    label, _, sets = text.partition(":")
    return label.strip(), [s.strip() for s in sets.split(";") if s.strip()]


def dig(metrics: dict[str, Any], path: str) -> float | None:
    node: Any = metrics
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, int | float) else None


def run_one(label: str, sets: list[str], seed: int, *, args: argparse.Namespace, threads: int) -> dict[str, Any]:
    tag = f"{re.sub(r'[^a-z0-9]+', '-', label.lower()).strip('-') or 'base'}-s{seed}"
    overrides = [f"train.seed={seed}", f"train.threads={threads}", f"name='{tag}'", *sets, *args.extra]
    cmd = [sys.executable, "-m", "training", "train", "--config", str(args.config), "--out", str(args.out / tag)]
    if args.data:
        cmd += ["--data", str(args.data)]
    for o in overrides:
        cmd += ["--set", o]
    with (args.out / f"{tag}.log").open("w") as log:
        done = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:  # one failed run is reported, the others still run
        print(f"{tag}: exit {done.returncode}, see {args.out / tag}.log", file=sys.stderr)
        return {"failed": done.returncode}
    metrics: dict[str, Any] = json.loads((latest_versions(args.out / tag)[tag] / "metrics.json").read_text())
    return metrics


def cell(values: list[float | None]) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    return f"{v[0]:.4f}" if len(v) == 1 else f"{statistics.mean(v):.4f} ± {statistics.stdev(v):.4f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--variant", action="append", default=[], help="'label:override;override' (repeatable)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads a run (0: the cores shared out)")
    ap.add_argument("--metric", action="append", required=True, help="dotted path in metrics.json (repeatable)")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="override for every run")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "sweep")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.data = args.data.resolve() if args.data else None
    variants = [parse_variant(v) for v in args.variant] or [("config", [])]
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.parallel)
    jobs = [(label, sets, seed) for label, sets in variants for seed in args.seeds]
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda j: run_one(j[0], j[1], j[2], args=args, threads=threads), jobs))
    by_label: dict[str, list[dict[str, Any]]] = {}
    for (label, _, _), m in zip(jobs, results, strict=True):
        by_label.setdefault(label, []).append(m)
    (args.out / "sweep.json").write_text(json.dumps(by_label, indent=1))
    print(f"| run | n | train s | {' | '.join(args.metric)} |")
    print("|---|---|---|" + "---|" * len(args.metric))
    for name in next((m["baselines_test"] for m in results if "baselines_test" in m), {}):
        paths = [re.sub(r"^test\.", f"baselines_test.{name}.", p) for p in args.metric]
        print(
            f"| baseline: {name} | {len(results)} | - | "
            f"{' | '.join(cell([dig(m, p) for m in results]) for p in paths)} |"
        )
    for label, ms in by_label.items():
        print(
            f"| {label} | {len(ms)} | {cell([dig(m, 'train_seconds') for m in ms])} | "
            f"{' | '.join(cell([dig(m, p) for m in ms]) for p in args.metric)} |"
        )


if __name__ == "__main__":
    main()
