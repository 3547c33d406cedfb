"""How wide must a recommender's transition table be? Validation NDCG@10 by table width and prior weight.

    .venv/bin/python -m bench.training.transition_width runs/<out>/sasrec-beauty/<version> \
        --config training/configs/sasrec_beauty.toml --widths 0 20 50 100

Takes a trained SASRec or BERT4Rec artifact (one trained without the refit, so that the validation items are
unseen), gives its weights a transition table of each width filled from the job's training part
(models/transitions.py), and scores the job's whole validation split once per weight of the job's
own grid (`eval.transition_weights`), through the job's evaluation. The test split is not read.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from models.kinds import MODEL_KINDS, build_recommender
from training.jobs.recommend import RecommendJob


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--config", type=Path, default=Path("training/configs/sasrec_beauty.toml"))
    ap.add_argument("--widths", type=int, nargs="+", default=[0, 20, 50, 100])
    ap.add_argument("--data", type=Path, help="the log (default: the config's data.path)")
    args = ap.parse_args()

    job = RecommendJob.prepared(args.config, data=args.data)
    saved = torch.load(args.artifact / "model.pt", weights_only=True)
    weights = {k: v for k, v in saved["state_dict"].items() if "successor" not in k}
    print(f"{len(job.split.valid.targets)} validation users; NDCG@10 by prior weight")
    for width in args.widths:
        known = {f.name for f in dataclasses.fields(MODEL_KINDS[saved["kind"]][0])}
        config = {k: v for k, v in saved["config"].items() if k in known}  # older checkpoints: fields since dropped
        config.update(transition_width=width, transition_weight=0.0)
        model = build_recommender(saved["kind"], config).eval()
        model.load_state_dict(weights, strict=False)
        job.max_history = model.max_history
        model.set_transitions(job.split.train)
        row = []
        for w in job.cfg.eval.transition_weights if width else [0.0]:
            model.config.transition_weight = w
            got = job._evaluate_all({"model": model.scores}, job.split.valid, ["full"], device="cpu")
            ndcg = got.metrics["model"]["full"]["NDCG@10"]
            row.append(f"{w:g}: {ndcg:.4f}")
        print(f"width {width}: " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
