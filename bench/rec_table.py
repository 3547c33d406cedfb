"""Markdown table of recommendation artifacts' test metrics, the popularity baseline beside them.

    .venv/bin/python bench/rec_table.py artifacts/sasrec-beauty/<version> artifacts/bert4rec-beauty/<version>

All figures come from the artifacts' metrics.json, written by the training job: the same
evaluation code, split and negatives for the models and the baselines (popularity, item
transitions, item-kNN).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(name: str, m: dict, minutes: str) -> str:
    nan = {k: float("nan") for k in ("HR@1", "HR@5", "HR@10", "NDCG@5", "NDCG@10", "MRR")}
    pop, full, uni = m.get("popularity", nan), m.get("full", nan), m.get("uniform", nan)
    return (f"| {name} | {pop['HR@1']:.4f} | {pop['HR@5']:.4f} | {pop['HR@10']:.4f} | {pop['NDCG@5']:.4f} | "
            f"{pop['NDCG@10']:.4f} | {pop['MRR']:.4f} | {full['HR@10']:.4f} | {full['NDCG@10']:.4f} | "
            f"{uni['NDCG@10']:.4f} | {minutes} |")


def main(folders: list[str]) -> None:
    print("| model | HR@1 | HR@5 | HR@10 | NDCG@5 | NDCG@10 | MRR | full HR@10 | full NDCG@10 "
          "| uniform-100 NDCG@10 | train min |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    baselines: dict = {}
    for f in folders:
        metrics = json.loads((Path(f) / "metrics.json").read_text())
        run = json.loads((Path(f) / "run_config.json").read_text())
        name = f"{run['kind']} ({Path(f).parent.name})"
        print(row(name, metrics["test"], f"{metrics['train_seconds'] / 60:.1f}"))
        baselines = baselines or metrics.get("baselines_test") or {"popularity": metrics["baseline_popularity_test"]}
    for name, m in baselines.items():
        print(row(f"baseline: {name}", m, "-"))


if __name__ == "__main__":
    main(sys.argv[1:])
