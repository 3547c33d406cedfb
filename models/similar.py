"""Item-to-item neighbours ("more like this"): what POST /similar-items ranks and the training job
measures, from one of three sources chosen on validation (docs/decisions/similar-items.md):
  embedding     cosine between the model's item vectors (its output table): computed per request
  transitions   how often item b directly followed item a in a user's history
  cooccurrence  how often a and b lie within COOCCURRENCE_WINDOW steps of each other in one history
The two counting sources are tables the job writes into the artifact (the top NEIGHBOURS of each item,
SIMILAR_ITEMS and SIMILAR_SCORES); the embedding needs none. Each row is a (V,) score vector, so the
exclusions, filters and hidden items of models/ranking.py apply as for /recommend."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from models.artifact import ArtifactError, check
from models.ids import N_SPECIAL, PAD

SOURCES = ("embedding", "transitions", "cooccurrence")
COUNTED = SOURCES[1:]  # the sources whose neighbours are a table in the artifact
SIMILAR_ITEMS = "similar_items.npy"  # int32 (V, NEIGHBOURS): each item's neighbours, best first, PAD past the end
SIMILAR_SCORES = "similar_scores.npy"  # float32 (V, NEIGHBOURS): their counts
NEIGHBOURS = 100  # kept per item: the most a /similar-items query can ask for from a counting source
COOCCURRENCE_WINDOW = 3
RECENT_STEPS = 200  # each history's newest steps that are counted (a bound on a long history's pairs)


def cosine_scores(table: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """(B, V) cosine between each of `items` (B,) and every entity of `table` (V, D); the item itself and the
    specials at -inf."""
    unit = torch.nn.functional.normalize(table.float(), dim=1)
    s = unit[items] @ unit.T  # (B, V)
    s[:, :N_SPECIAL] = float("-inf")
    s[torch.arange(len(items), device=s.device), items] = float("-inf")
    return s


def table_scores(rows: torch.Tensor, counts: torch.Tensor, size: int) -> torch.Tensor:
    """(B, V): the neighbours of B items (their (B, S) table rows) at their counts, every other entity -inf."""
    out = torch.full((len(rows), size), float("-inf"), device=rows.device)
    rows = rows.long()
    vals = counts.float().masked_fill(rows == PAD, float("-inf"))
    out.scatter_(1, rows, vals)
    out[:, PAD] = float("-inf")
    return out


def pair_counts(sequences: Sequence[Sequence[int]], *, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (a, b) pair the source counts over `sequences` (item indices, oldest first; each one's newest
    RECENT_STEPS): -> a, b, count, one row per distinct pair. transitions: b right after a; cooccurrence: within
    COOCCURRENCE_WINDOW steps either way."""
    seqs = [np.asarray(s[-RECENT_STEPS:], dtype=np.int64) for s in sequences if len(s) > 1]
    if not seqs:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    flat = np.concatenate(seqs)
    owner = np.repeat(np.arange(len(seqs)), [len(s) for s in seqs])
    steps = range(1, 2) if kind == "transitions" else range(1, COOCCURRENCE_WINDOW + 1)
    a_parts, b_parts = [], []
    for d in steps:
        same = owner[d:] == owner[:-d]
        a, b = flat[:-d][same], flat[d:][same]
        a_parts.append(a)
        b_parts.append(b)
        if kind == "cooccurrence":
            a_parts.append(b)
            b_parts.append(a)
    a, b = np.concatenate(a_parts), np.concatenate(b_parts)
    keep = (a != b) & (a >= N_SPECIAL) & (b >= N_SPECIAL)
    a, b = a[keep], b[keep]
    width = int(max(a.max(initial=0), b.max(initial=0))) + 1
    codes, counts = np.unique(a * width + b, return_counts=True)
    return codes // width, codes % width, counts


def neighbour_table(
    sequences: Sequence[Sequence[int]], size: int, *, kind: str, keep: int = NEIGHBOURS
) -> tuple[np.ndarray, np.ndarray]:
    """The counting source's table over `size` entities: (size, keep) int32 neighbours, best first (ties by
    index), PAD past a row's end, and (size, keep) float32 counts."""
    a, b, n = pair_counts(sequences, kind=kind)
    order = np.lexsort((b, -n, a))  # by a, then most counted, then index
    a, b, n = a[order], b[order], n[order]
    starts = np.searchsorted(a, np.arange(size))
    rank = np.arange(len(a)) - starts[a]
    kept = rank < keep
    neighbours = np.full((size, keep), PAD, dtype=np.int32)
    counts = np.zeros((size, keep), dtype=np.float32)
    neighbours[a[kept], rank[kept]] = b[kept]
    counts[a[kept], rank[kept]] = n[kept]
    return neighbours, counts


def hit_rate(top: torch.Tensor, targets: torch.Tensor) -> float:
    """Share of rows whose target is among `top` (B, K)."""
    if len(targets) == 0:
        return 0.0
    return float((top == targets[:, None]).any(1).float().mean())


def read_table(folder: Path, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The version's neighbour table, memory-mapped read-only (np.load never unpickles here); every defect
    an ArtifactError naming the file."""
    try:
        items = np.load(folder / SIMILAR_ITEMS, mmap_mode="r", allow_pickle=False)
        scores = np.load(folder / SIMILAR_SCORES, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ArtifactError(SIMILAR_ITEMS, f"not a readable table ({type(exc).__name__})") from None
    check(items.dtype == np.int32 and items.ndim == 2, SIMILAR_ITEMS, f"expected 2-d int32, found {items.dtype}")
    check(items.shape[0] == size, SIMILAR_ITEMS, f"{items.shape[0]} rows for {size} ids")
    check(scores.dtype == np.float32 and scores.shape == items.shape, SIMILAR_SCORES, "expected float32 of its shape")
    check(bool(((items >= 0) & (items < size)).all()), SIMILAR_ITEMS, "an index outside the id map")
    return items, scores


def rows_of(items: np.ndarray, scores: np.ndarray, at: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The table's rows of `at`, as tensors (only those pages are read)."""
    return torch.from_numpy(np.array(items[list(at)])), torch.from_numpy(np.array(scores[list(at)]))
