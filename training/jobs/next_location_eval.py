"""Next-location metrics (Acc@K, MRR, NDCG@10, weighted F1) and the protocol's simple baselines."""

from __future__ import annotations

import itertools
import math

import torch

from models.ids import PAD

KS = (1, 5, 10)


def location_metrics(scores: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """scores: (N, V), targets: (N,). Ties count against the target. Weighted F1 of the top-1."""
    t = scores.gather(1, targets[:, None])
    ranks = (scores > t).sum(1) + ((scores == t).sum(1) - 1)  # ties against the target
    r = ranks.double()
    out = {f"Acc@{k}": (r < k).double().mean().item() for k in KS}
    out["MRR"] = (1.0 / (r + 1)).mean().item()
    out["NDCG@10"] = torch.where(r < 10, 1.0 / torch.log2(r + 2), torch.zeros_like(r)).mean().item()
    out["F1_weighted"] = weighted_f1(scores.argmax(1), targets, scores.size(1))
    out["n"] = float(len(targets))
    return out


def weighted_f1(pred: torch.Tensor, target: torch.Tensor, n_classes: int) -> float:
    """F1 per class weighted by the class's support among the targets (sklearn's 'weighted')."""
    tp = torch.bincount(target[pred == target], minlength=n_classes).double()
    pred_n = torch.bincount(pred, minlength=n_classes).double()
    true_n = torch.bincount(target, minlength=n_classes).double()
    denom = pred_n + true_n
    f1 = torch.where(denom > 0, 2 * tp / denom.clamp(min=1), torch.zeros_like(tp))
    return float((f1 * true_n).sum() / true_n.sum())


def most_recent_scores(history: torch.Tensor, vocab: int) -> torch.Tensor:
    """history: (N, L) right-padded location indices -> (N, V): later visits score higher."""
    n, length = history.shape
    pos = torch.arange(1, length + 1, dtype=torch.float).expand(n, -1)
    pos = pos.masked_fill(history == PAD, 0.0)
    s = torch.zeros(n, vocab).scatter_reduce(1, history, pos, reduce="amax", include_self=True)
    return _unvisited_last(s, history)


def most_frequent_scores(history: torch.Tensor, vocab: int) -> torch.Tensor:
    """(N, V): visit counts in the history; ties broken by first appearance."""
    n, length = history.shape
    valid = (history != PAD).float()
    counts = torch.zeros(n, vocab).scatter_add(1, history, valid)
    # Earlier first appearance wins a tie: add a bonus below 1 that falls with the first position.
    first = torch.full((n, vocab), float(length)).scatter_reduce(
        1, history, torch.arange(length, dtype=torch.float).expand(n, -1), reduce="amin", include_self=True
    )
    s = counts + (1.0 - first / (length + 1)) * (counts > 0)
    return _unvisited_last(s, history)


def _unvisited_last(s: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    visited = torch.zeros_like(s, dtype=torch.bool).scatter_(1, history, True)
    visited[:, PAD] = False
    s = s.masked_fill(~visited, -math.inf)
    return s


def markov_scores(transitions: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """First-order Markov chain: transitions (V, V) counts fitted on train, last: (N,) -> (N, V)."""
    s = transitions[last].double()
    s[:, :1] = -math.inf  # padding
    return s.masked_fill(s == 0, -math.inf).float()


def fit_transitions(sequences: list[list[int]], vocab: int) -> torch.Tensor:
    m = torch.zeros(vocab, vocab)
    for seq in sequences:
        for a, b in itertools.pairwise(seq):
            m[a, b] += 1
    return m
