"""Evaluation of "whom next": ranks over candidate users, the metrics, and the baselines, as tensors."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from training.data.social import Timelines

DAY = 86_400.0


def target_ranks(scores: torch.Tensor, target: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """1-based rank of each target among the candidates, ties broken at random in expectation.

    scores (B, V), target (B,), candidates (B, V) bool (the target must be one) -> (B,) float.
    """
    s = scores.float().masked_fill(~candidates, float("-inf"))
    t = s.gather(1, target[:, None])
    greater = ((s > t) & candidates).sum(1)
    ties = ((s == t) & candidates).sum(1) - 1
    return 1.0 + greater.float() + ties.float() / 2.0


def rank_metrics(ranks: torch.Tensor, k: int = 10) -> dict[str, float]:
    if len(ranks) == 0:
        return {"n": 0}
    hit = ranks <= k
    ndcg = torch.where(hit, 1.0 / torch.log2(ranks + 1.0), torch.zeros_like(ranks))
    return {
        f"HR@{k}": float(hit.float().mean()),
        f"NDCG@{k}": float(ndcg.mean()),
        "MRR": float((1.0 / ranks).mean()),
        "n": len(ranks),
    }


def split_metrics(ranks: torch.Tensor, repeat: torch.Tensor) -> dict[str, dict[str, float]]:
    """On all queries, on repeat targets (interacted with before) and on new targets."""
    return {"all": rank_metrics(ranks), "repeat": rank_metrics(ranks[repeat]), "new": rank_metrics(ranks[~repeat])}


@dataclass
class QuerySet:
    """Queries of one period, as event indices, with what ranking them needs."""

    events: np.ndarray  # (Q,) indices into the log
    target: torch.Tensor  # (Q,) user index
    actor: torch.Tensor  # (Q,) user index of the actor (UNK if unknown)
    repeat: torch.Tensor  # (Q,) bool
    time: torch.Tensor  # (Q,) float64 unix seconds
    pool: torch.Tensor  # (V,) bool: users known before the period (the candidates, the actor aside)

    def __len__(self) -> int:
        return len(self.events)

    def batches(self, size: int) -> Iterator[slice]:
        for lo in range(0, len(self), size):
            yield slice(lo, min(lo + size, len(self)))

    def shuffled(self, seed: int, n: int | None = None) -> QuerySet:
        """These queries in a seeded random order (the first `n` of it: a seeded sample), same pool."""
        index = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))[:n]
        events = self.events[index.numpy()]
        return QuerySet(events, self.target[index], self.actor[index], self.repeat[index], self.time[index], self.pool)

    def candidates(self, part: slice) -> torch.Tensor:
        """(B, V): the period's pool without each query's actor."""
        cand = self.pool[None, :].repeat(part.stop - part.start, 1)
        cand[torch.arange(part.stop - part.start), self.actor[part]] = False
        return cand


def evaluate_scorer(
    queries: QuerySet, score: Callable[[slice], torch.Tensor], *, batch_size: int = 512
) -> dict[str, dict[str, float]]:
    """Metrics of a scorer: a function from a slice of the queries to their (B, V) scores."""
    return evaluate_scorers(queries, {"scorer": score}, batch_size=batch_size)[0]["scorer"]


def evaluate_scorers(
    queries: QuerySet,
    scorers: Mapping[str, Callable[[slice], torch.Tensor]],
    *,
    batch_size: int = 512,
    deadline: float | None = None,
) -> tuple[dict[str, dict[str, dict[str, float]]], int]:
    """Every scorer on the same queries, batch by batch in their order (give a seeded shuffle); with a
    `deadline` (a time.monotonic() value) it stops after the first batch that ends past it, so each scorer
    is measured on the same first queries. -> (metrics per scorer, the queries scored)."""
    ranks: dict[str, list[torch.Tensor]] = {name: [] for name in scorers}
    done = 0
    for part in queries.batches(batch_size):
        candidates = queries.candidates(part)
        for name, score in scorers.items():
            ranks[name].append(target_ranks(score(part), queries.target[part], candidates))
        done = part.stop
        if deadline is not None and time.monotonic() >= deadline:
            break
    repeat = queries.repeat[:done]
    return {n: split_metrics(torch.cat(r) if r else torch.zeros(0), repeat) for n, r in ranks.items()}, done


@dataclass
class Baselines:
    """The simple scorers every social model is measured beside."""

    timelines: Timelines
    event_targets: torch.Tensor  # (N,) user index of each event's target, time order
    event_times: np.ndarray  # (N,) unix seconds, sorted
    n_users: int
    contacts: Timelines | None = None  # both directions (Timelines.both_directions), for most_recent_contact
    contact_row: np.ndarray | None = None  # (N,) each event's row in `contacts`

    def popularity(self, before: int) -> Callable[[slice], torch.Tensor]:
        """Interactions received in the log's first `before` events (the training period)."""
        counts = torch.bincount(self.event_targets[:before], minlength=self.n_users).float()
        return lambda part: counts[None, :].expand(part.stop - part.start, -1)

    def recent_popularity(self, queries: QuerySet, days: float = 7.0) -> Callable[[slice], torch.Tensor]:
        """Interactions received by each user in the `days` before the query (earlier events only)."""
        lo_all = np.searchsorted(self.event_times, queries.time.numpy() - days * DAY, side="left")

        def score(part: slice) -> torch.Tensor:
            hi = torch.from_numpy(queries.events[part])
            lo = torch.from_numpy(lo_all[part])
            width = max(1, int((hi - lo).max()))
            idx = lo[:, None] + torch.arange(width)[None, :]
            valid = idx < hi[:, None]
            tgt = self.event_targets[idx.clamp(max=len(self.event_targets) - 1)]
            out = torch.zeros(len(hi), self.n_users)
            return out.scatter_add_(1, tgt, valid.float())

        return score

    def _history(self, queries: QuerySet, part: slice, *, both: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's whole history before each query (`both`: with what others did to them):
        the other users (B, W), valid (B, W), left-padded."""
        tl, rows = self.timelines, queries.events[part]
        if both:
            if self.contacts is None or self.contact_row is None:
                raise ValueError("most_recent_contact needs the timelines in both directions")
            tl, rows = self.contacts, self.contact_row[rows]
        width = int(tl.earlier(rows).max()) if len(rows) else 1
        targets, _, _ = tl.window(rows, max(width, 1))
        return targets, targets != 0

    def most_recent(self, queries: QuerySet, *, both: bool = False) -> Callable[[slice], torch.Tensor]:
        """The actor's distinct earlier targets, the most recent first; everyone else below."""

        def score(part: slice) -> torch.Tensor:
            targets, valid = self._history(queries, part, both=both)
            order = torch.arange(1, targets.size(1) + 1, dtype=torch.float32)[None].expand_as(targets)
            out = torch.full((targets.size(0), self.n_users), -1.0)
            return out.scatter_reduce_(1, targets, torch.where(valid, order, -1.0), reduce="amax")

        return score

    def most_recent_contact(self, queries: QuerySet) -> Callable[[slice], torch.Tensor]:
        """The actor's distinct earlier contacts in either direction (whom they acted on, who acted on
        them), the most recent first: reciprocity finds new targets that "most recent" cannot."""
        return self.most_recent(queries, both=True)

    def most_frequent(self, queries: QuerySet) -> Callable[[slice], torch.Tensor]:
        """The actor's earlier targets by how often they were the target; ties at random."""

        def score(part: slice) -> torch.Tensor:
            targets, valid = self._history(queries, part)
            out = torch.zeros(targets.size(0), self.n_users)
            return out.scatter_add_(1, targets, valid.float())

        return score
