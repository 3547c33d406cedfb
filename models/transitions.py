"""Item-to-item transition counts as a prior added to a recommender's scores.

For each item, its `width` most frequent next items in the training sequences and the log of
1 + how often each followed it. A model with a prior scores `model + weight * log1p(count(last, j))`,
the weight chosen on validation (docs/decisions/transition-prior.md); SASRec keeps the table as
buffers and adds it in `scores()`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch


def flatten(sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence's items end to end, and each sequence's length. -> (items (N,), lengths (S,)) long.

    Read once through NumPy's iterator reader: a list comprehension and torch.tensor over a 50M-row
    log took seconds per pass."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    items = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=int(lengths.sum()))
    return torch.from_numpy(items), torch.from_numpy(lengths)


def transition_pairs(sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (item, next item) pair within a sequence. -> (items (P,), next items (P,)) long."""
    items, lengths = flatten(sequences)
    last = torch.zeros(len(items), dtype=torch.bool)
    last[torch.cumsum(lengths, 0)[lengths > 0] - 1] = True  # a sequence's last item is followed by nothing
    within = ~last[:-1]
    return items[:-1][within], items[1:][within]


def pair_counts(sequences: Sequence[Sequence[int]], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """How often each (item, next item) pair occurs. -> (keys (P,) item * V + next item, sorted;
    counts (P,)), both long. Counts of parts of a log add up: `merge_counts`."""
    first, second = transition_pairs(sequences)
    keys = first * vocab_size + second
    del first, second  # freed before the unique's sort makes its copies (docs/decisions/columnar-log.md)
    return torch.unique(keys, return_counts=True)


def merge_counts(keys: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair counts with repeated keys (parts concatenated) -> one sorted count per key."""
    merged, where = torch.unique(keys, return_inverse=True)
    return merged, torch.zeros(len(merged), dtype=counts.dtype).scatter_add_(0, where, counts)


def top_successors(
    keys: torch.Tensor, counts: torch.Tensor, vocab_size: int, *, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `width` most frequent next items of each item and log1p of their counts, from `pair_counts`'
    keys (sorted, each once) and counts.

    -> (successors (V, width) int32, PAD where an item has fewer; log_counts (V, width) float32,
    0 there). Ties in count go to the smaller index, so the table does not depend on input order."""
    succ = torch.zeros(vocab_size, width, dtype=torch.int32)
    logc = torch.zeros(vocab_size, width)
    if len(keys) == 0 or width == 0:
        return succ, logc
    first, second = keys // vocab_size, keys % vocab_size  # sorted keys: by item, then next item
    # Within each first item, by count descending (a stable sort keeps ties in index order).
    order = torch.sort(counts, descending=True, stable=True).indices
    order = order[torch.sort(first[order], stable=True).indices]
    first, second, counts = first[order], second[order], counts[order]
    starts = torch.searchsorted(first, first, side="left")
    rank = torch.arange(len(first)) - starts
    keep = rank < width
    succ[first[keep], rank[keep]] = second[keep].to(torch.int32)
    logc[first[keep], rank[keep]] = torch.log1p(counts[keep].float())
    return succ, logc
