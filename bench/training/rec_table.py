"""Markdown table of recommendation artifacts' test metrics, the baselines of the same run beside them.

    .venv/bin/python -m bench.training.rec_table artifacts/sasrec-beauty/<version> artifacts/bert4rec-beauty/<version>

Whole-catalog ranking (seen items removed) comes first, with each row's NDCG@10 as a multiple of
the best baseline's; then the sampled protocols (100 negatives drawn by popularity, the BERT4Rec
paper's; 100 drawn uniformly). All figures come from the artifacts' metrics.json, written by the
training job: the same evaluation code, split and candidates for the models and the baselines
(popularity, item transitions, item-kNN). Baselines are printed once, from the first artifact.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

NAN: dict[str, float] = {k: math.nan for k in ("HR@1", "HR@10", "NDCG@10", "MRR")}


def best_full_ndcg(baselines: dict[str, Any]) -> float:
    return max((b.get("full", NAN)["NDCG@10"] for b in baselines.values()), default=math.nan)


def row(name: str, m: dict[str, Any], *, ratio: float, minutes: str) -> str:
    full, pop, uni = m.get("full", NAN), m.get("popularity", NAN), m.get("uniform", NAN)
    return (
        f"| {name} | {full['HR@1']:.4f} | {full['HR@10']:.4f} | {full['NDCG@10']:.4f} | {full['MRR']:.4f} | "
        f"{ratio:.2f}x | {pop['HR@10']:.4f} | {pop['NDCG@10']:.4f} | {pop['MRR']:.4f} | "
        f"{uni['NDCG@10']:.4f} | {minutes} |"
    )


def main(folders: list[str]) -> None:
    print(
        "| model | full HR@1 | full HR@10 | full NDCG@10 | full MRR | x best baseline "
        "| pop-100 HR@10 | pop-100 NDCG@10 | pop-100 MRR | uniform-100 NDCG@10 | train min |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    baselines: dict[str, Any] = {}
    for f in folders:
        metrics = json.loads((Path(f) / "metrics.json").read_text())
        run = json.loads((Path(f) / "run_config.json").read_text())
        baselines = baselines or metrics.get("baselines_test", {})
        # The job's own ratio: against the best baseline of the same run.
        ratio = metrics.get("full_ndcg10_vs_best_baseline", {}).get("ratio", math.nan)
        name = f"{run['kind']} ({run.get('name', Path(f).parent.name)})"
        print(row(name, metrics["test"], ratio=ratio, minutes=f"{metrics['train_seconds'] / 60:.1f}"))
    best = best_full_ndcg(baselines)
    for name, m in baselines.items():
        ratio = m.get("full", NAN)["NDCG@10"] / best if best > 0 else math.nan
        print(row(f"baseline: {name}", m, ratio=ratio, minutes="-"))


if __name__ == "__main__":
    main(sys.argv[1:])
