"""Ranking metrics over held-out targets: full ranking or sampled negatives, HR/NDCG/MRR@K."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from models.ids import N_SPECIAL
from models.ranking import index_mask, pack_histories, pad_rows
from training.splits import EvalSet

KS = (1, 5, 10)
ScoreFn = Callable[[torch.Tensor], torch.Tensor]  # (B, L) histories -> (B, V) scores


def metrics_from_ranks(ranks: torch.Tensor, ks: tuple[int, ...] = KS) -> dict[str, float]:
    """ranks: (N,) 0-based rank of each target -> HR@K, NDCG@K, MRR averaged over targets."""
    r = ranks.double()
    out: dict[str, float] = {}
    for k in ks:
        hit = r < k
        out[f"HR@{k}"] = hit.double().mean().item()
        out[f"NDCG@{k}"] = torch.where(hit, 1.0 / torch.log2(r + 2.0), torch.zeros_like(r)).mean().item()
    out["MRR"] = (1.0 / (r + 1.0)).mean().item()
    return out


def target_ranks(scores: torch.Tensor, targets: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """0-based rank of each target among its candidates; ties count against the target.

    scores: (B, V); targets: (B,); candidates: (B, V) bool (the target need not be flagged).
    """
    t = scores.gather(1, targets[:, None])  # (B, 1)
    others = candidates.clone()
    others[torch.arange(len(targets)), targets] = False
    return ((scores >= t) & others).sum(1)


def evaluate(
    score_fn: ScoreFn,
    data: EvalSet,
    vocab_size: int,
    max_history: int,
    protocol: str = "full",
    n_negatives: int = 100,
    popularity: torch.Tensor | None = None,
    exclude_seen: bool = True,
    batch_size: int = 512,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Score every held-out target with `score_fn` under one protocol.

    protocol "full": the target against every catalog item (minus the user's earlier items when
    `exclude_seen`); "uniform"/"popularity": against `n_negatives` items the user never interacted
    with, drawn without replacement uniformly or in proportion to `popularity` (V,).
    """
    if protocol not in ("full", "uniform", "popularity"):
        raise ValueError(f"unknown protocol {protocol!r}")
    if not data.targets:
        return {}
    gen = torch.Generator().manual_seed(seed)
    weights = torch.ones(vocab_size) if protocol != "popularity" else popularity
    if weights is None:
        raise ValueError("popularity sampling needs item counts")
    weights = weights.double().clone()
    weights[:N_SPECIAL] = 0
    all_ranks = []
    for lo in range(0, len(data.targets), batch_size):
        hist = data.histories[lo : lo + batch_size]
        seq = pack_histories(hist, max_history).to(device)
        targets = torch.tensor(data.targets[lo : lo + batch_size])
        with torch.inference_mode():
            scores = score_fn(seq).float().cpu()  # (B, V)
        if protocol == "full":
            cand = torch.ones_like(scores, dtype=torch.bool)
            cand[:, :N_SPECIAL] = False
            if exclude_seen:
                cand &= ~index_mask(pad_rows(hist), vocab_size)
        else:
            touched = index_mask(pad_rows(data.interacted[lo : lo + batch_size]), vocab_size)
            probs = weights[None, :].expand(len(hist), -1).masked_fill(touched, 0.0)
            if int((probs > 0).sum(1).min()) < n_negatives:
                # multinomial would silently draw zero-weight (interacted) items instead
                raise ValueError(f"a user has fewer than {n_negatives} items left to sample negatives from")
            neg = torch.multinomial(probs, n_negatives, replacement=False, generator=gen)  # (B, n)
            cand = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, neg, True)
        all_ranks.append(target_ranks(scores, targets, cand))
    ranks = torch.cat(all_ranks)
    out = metrics_from_ranks(ranks)
    out["n"] = float(len(ranks))
    return out


def popularity_scorer(train: list[list[int]], vocab_size: int) -> tuple[ScoreFn, torch.Tensor]:
    """The popularity baseline: every user gets log(1 + training count) of each item."""
    counts = item_counts(train, vocab_size)
    base = torch.log1p(counts.float())
    base[:N_SPECIAL] = -math.inf

    def score(seq: torch.Tensor) -> torch.Tensor:
        return base[None, :].expand(seq.size(0), -1).to(seq.device)

    return score, counts


def item_counts(sequences: list[list[int]], vocab_size: int) -> torch.Tensor:
    flat = torch.tensor([i for s in sequences for i in s], dtype=torch.long)
    return torch.bincount(flat, minlength=vocab_size)[:vocab_size]
