"""Batch prediction: top-K for every user of an artifact, seen and future items excluded, to CSV."""

from __future__ import annotations

import csv
import datetime as dt
import math
from pathlib import Path

import torch

from models.artifact import load_rec_artifact
from models.ranking import recommend, reference_value, release_tensor


def predict_all(artifact_dir: Path, k: int, out_dir: Path, batch_size: int = 256) -> Path:
    art = load_rec_artifact(artifact_dir)
    release = release_tensor(art.items.raws(), art.release) if art.release_unit else None
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"predictions_{art.manifest.get('name', artifact_dir.parent.name)}_k{k}_{stamp}.csv"
    users = list(art.histories)
    with out.open("w", newline="") as f, torch.inference_mode():
        w = csv.writer(f)
        w.writerow(["user_id", "item_id", "rank", "score"])
        for lo in range(0, len(users), batch_size):
            batch = users[lo : lo + batch_size]
            hists = [art.histories[u] for u in batch]
            idx = [[i for i in art.items.indices([it for it, _ in h]) if i > 1] for h in hists]
            ref: list[float | None] | None = None
            if art.release_unit:
                last = [h[-1][1] if h else math.nan for h in hists]
                ref = [None if math.isnan(t) else reference_value(t, art.release_unit) for t in last]
            ranked = recommend(art.model, idx, k, [True] * len(batch), [[] for _ in batch], release, ref)
            for row, user in enumerate(batch):
                for r in range(ranked.indices.size(1)):
                    score = float(ranked.scores[row, r])
                    if not math.isfinite(score):
                        break
                    w.writerow([user, art.items.raw(int(ranked.indices[row, r])), r + 1, f"{score:.6f}"])
    return out
