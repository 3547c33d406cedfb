"""Ablation of the social model: `model.positions` values x received steps (`data.incoming`) x seeds,
at an equal budget.

    .venv/bin/python bench/social_ablation.py --seeds 1 2 3 --parallel 2 --incoming true false \
        --set train.max_minutes=2

Runs `python -m training train` per (incoming, positions, seed), `--parallel` at a time with the cores
shared out (train.threads), and prints test NDCG@10 / HR@10 (all, repeat, new) as mean +- std per
variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from models.artifact import latest_versions

ROOT = Path(__file__).resolve().parent.parent
POSITIONS = ("none", "learned", "rope", "time")


def run_one(positions: str, seed: int, *, incoming: bool, out: Path, config: Path, threads: int,
            extra: list[str]) -> dict:
    name = f"social-{positions}-{'in' if incoming else 'out'}-s{seed}"
    sets = [f"model.positions='{positions}'", f"data.incoming={str(incoming).lower()}", f"train.seed={seed}",
            f"name='{name}'", f"train.threads={threads}", *extra]
    cmd = [sys.executable, "-m", "training", "train", "--config", str(config), "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    log = out / f"{name}.log"
    with log.open("w") as f:
        subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=True)
    metrics = json.loads((latest_versions(out)[name] / "metrics.json").read_text())
    return {"positions": positions, "incoming": incoming, "seed": seed, "train_seconds": metrics["train_seconds"],
            "epochs": metrics["epochs_run"], "test": metrics["test"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=ROOT / "training/configs/social_mathoverflow.toml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--positions", nargs="+", default=list(POSITIONS))
    ap.add_argument("--incoming", nargs="+", choices=["true", "false"], default=["true"],
                    help="histories with received steps (the default model), without, or both")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "runs/social_ablation")
    ap.add_argument("--set", dest="extra", action="append", default=[])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // args.parallel)
    variants = [(i == "true", p) for i in args.incoming for p in args.positions]
    jobs = [(i, p, s) for s in args.seeds for i, p in variants]
    with ThreadPoolExecutor(args.parallel) as pool:
        rows = list(pool.map(lambda j: run_one(j[1], j[2], incoming=j[0], out=args.out, config=args.config,
                                               threads=threads, extra=args.extra), jobs))
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    print("| received steps | positions | runs | test NDCG@10 | HR@10 | repeat NDCG@10 | new HR@10 | train s |")
    print("|---|---|---|---|---|---|---|---|")
    for inc, p in variants:
        mine = [r for r in rows if r["positions"] == p and r["incoming"] == inc]

        def stat(get, rs=mine) -> str:  # type: ignore[no-untyped-def]
            v = [get(r) for r in rs]
            return f"{statistics.mean(v):.4f} +- {statistics.stdev(v) if len(v) > 1 else 0.0:.4f}"

        print(f"| {'yes' if inc else 'no'} | {p} | {len(mine)} | {stat(lambda r: r['test']['all']['NDCG@10'])} | "
              f"{stat(lambda r: r['test']['all']['HR@10'])} | {stat(lambda r: r['test']['repeat']['NDCG@10'])} | "
              f"{stat(lambda r: r['test']['new']['HR@10'])} | {stat(lambda r: r['train_seconds'])} |")


if __name__ == "__main__":
    main()
