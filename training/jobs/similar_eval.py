"""Similar items, offline (models/similar.py): for each held-out pair (a user's last item before the
target, the target), how often the target is among the item's top SIM_K neighbours, for every source;
the source with the best validation figure is the one the artifact serves, and the test figures of all
of them go into its metrics (docs/decisions/similar-items.md)."""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

from models.base import SequentialRecommender
from models.similar import (
    COUNTED,
    NEIGHBOURS,
    SIMILAR_ITEMS,
    SIMILAR_SCORES,
    SOURCES,
    cosine_scores,
    hit_rate,
    neighbour_table,
)
from training.splits import EvalSet

log = logging.getLogger(__name__)
SIM_K = 10
MAX_PAIRS = 20_000  # held-out pairs scored per split, a seeded sample beyond
MAX_STEPS = 5_000_000  # history steps the counting tables are built from, a seeded sample of users beyond
ROWS = 512  # embedding rows scored at once


def held_out_pairs(data: EvalSet, *, seed: int, limit: int = MAX_PAIRS) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b): each user's newest history item and the target that followed it (a != b)."""
    pairs = [(h[-1], t) for h, t in zip(data.histories, data.targets, strict=True) if h and h[-1] != t]
    if len(pairs) > limit:
        pairs = random.Random(seed).sample(pairs, limit)
    a = torch.tensor([p[0] for p in pairs], dtype=torch.long)
    b = torch.tensor([p[1] for p in pairs], dtype=torch.long)
    return a, b


def bounded(sequences: list[list[int]], *, seed: int, limit: int = MAX_STEPS) -> list[list[int]]:
    """`sequences`, or a seeded sample of them holding at most `limit` steps (a large log's tables)."""
    if sum(len(s) for s in sequences) <= limit:
        return sequences
    order = list(range(len(sequences)))
    random.Random(seed).shuffle(order)
    out, steps = [], 0
    for i in order:
        if steps + len(sequences[i]) > limit:
            break
        out.append(sequences[i])
        steps += len(sequences[i])
    return out


def figures(
    model: SequentialRecommender, sequences: list[list[int]], data: EvalSet, *, n_items: int, seed: int
) -> dict[str, float]:
    """Each source's hit rate at SIM_K on `data`'s pairs, its counting tables built from `sequences` (what the
    split knows before those targets)."""
    a, b = held_out_pairs(data, seed=seed)
    out: dict[str, float] = {}
    form = model.dot_form()
    if form is not None:
        table = form.table.detach().cpu()
        hits = 0.0
        for start in range(0, len(a), ROWS):
            rows = a[start : start + ROWS]
            top = cosine_scores(table, rows).topk(SIM_K, dim=1).indices
            hits += hit_rate(top, b[start : start + ROWS]) * len(rows)
        out["embedding"] = hits / max(len(a), 1)
    known = bounded(sequences, seed=seed)
    for kind in COUNTED:
        neighbours, _ = neighbour_table(known, n_items, kind=kind, keep=SIM_K)
        out[kind] = hit_rate(torch.from_numpy(neighbours)[a].long(), b)
    return {k: round(v, 4) for k, v in out.items()}


class SimilarItems:
    """The job's similar-items step: the validation figures (before a refit sees the validation items), then
    the test figures and the chosen source, then the artifact's table when a counting source won."""

    def __init__(self, n_items: int, seed: int) -> None:
        self.n_items, self.seed = n_items, seed
        self.valid: dict[str, float] = {}
        self.pairs: dict[str, int] = {}

    def validate(self, model: SequentialRecommender, train: list[list[int]], valid: EvalSet) -> None:
        self.valid = figures(model, train, valid, n_items=self.n_items, seed=self.seed)
        self.pairs["valid"] = len(held_out_pairs(valid, seed=self.seed)[0])
        log.info("similar items, validation hit rate@%d: %s", SIM_K, self.valid)

    @property
    def chosen(self) -> str:
        """The best validation figure (the earlier source on a tie: the embedding needs no table)."""
        if not self.valid:
            return "embedding"
        return max(SOURCES, key=lambda s: (self.valid.get(s, -1.0), -SOURCES.index(s)))

    def metrics(self, model: SequentialRecommender, known: list[list[int]], test: EvalSet) -> dict[str, Any]:
        got = figures(model, known, test, n_items=self.n_items, seed=self.seed)
        self.pairs["test"] = len(held_out_pairs(test, seed=self.seed)[0])
        log.info("similar items, test hit rate@%d: %s (serving %s)", SIM_K, got, self.chosen)
        return {
            "source": self.chosen,
            "k": SIM_K,
            "valid_hit_rate": self.valid,
            "test_hit_rate": got,
            "pairs": self.pairs,
        }

    def files(self, sequences: list[list[int]]) -> dict[str, np.ndarray]:
        """The table the artifact serves from, over every sequence; none for the embedding."""
        if self.chosen == "embedding":
            return {}
        known = bounded(sequences, seed=self.seed)
        neighbours, counts = neighbour_table(known, self.n_items, kind=self.chosen, keep=NEIGHBOURS)
        return {SIMILAR_ITEMS: neighbours, SIMILAR_SCORES: counts}
