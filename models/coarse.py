"""Exact top-k over a wide catalog from bfloat16 scores and a certificate (docs/decisions/coarse-ranking.md).

For a model whose scores are `query @ table.T + bias` (models.base.DotForm), every item is scored
once in bfloat16, which reads half the bytes and runs on the CPU's bf16 dot-product units; the
best CANDIDATES of those coarse scores (after the exclusions) are scored again in float32, exactly
as the model scores them. A coarse score is within ERROR * |query| * |row| of the float32 one, so
a row is certified when its k-th exact score beats every coarse score left out by more than that
bound: then no item outside the candidates can enter its top k. A row that is not certified is
ranked again from its float32 scores over the whole catalog. The answer is the float32 model's top k
either way; only the time differs. A model's sparse additions (DotForm.additions, the transition
prior) are added to the exact scores, and their items always join the candidates: an item left out
has no addition, so the certificate is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from models.base import SequentialRecommender
from models.ids import N_SPECIAL
from models.ranking import Popular, Ranked, SeqRanker, exclude, rank_sparse, top_k

UNIT = 2.0**-8  # bfloat16's unit roundoff
# |coarse - float32 score| <= 3.1 UNIT * sum_i |q_i w_i| for D <= 1024 (the record derives it), and
# sum_i |q_i w_i| <= |q| |w|; 4 UNIT leaves a margin for the norms' own rounding.
ERROR = 4 * UNIT
CANDIDATES = 128  # coarse candidates rescored per row: no row of a 1M-item SASRec fell back (the record)
MIN_SPEEDUP = 1.2  # the coarse path is kept only when it is at least this much faster at load

QueryFn = Callable[[torch.Tensor], torch.Tensor]  # (B, L) histories -> (B, D) queries


class CoarseRanker:
    """Ranks with exclusions like `rank_sparse(model.scores(seq), ...)`, the exact same top k, through
    coarse scores. `query` computes model.query (a trace, models/traced.py, or the method itself)."""

    def __init__(self, model: SequentialRecommender, query: QueryFn, *, candidates: int = CANDIDATES) -> None:
        form = model.dot_form()
        if form is None:
            raise ValueError(f"{type(model).__name__} has no dot form to rank coarsely")
        table = form.table.detach().float()
        if form.bias is not None:  # the bias as one more dimension, read by a query that ends in 1
            table = torch.cat([table, form.bias.detach().float()[:, None]], 1)
        self.table = table  # (V, D) or (V, D + 1)
        self.coarse = table.to(torch.bfloat16)
        self.biased = form.bias is not None
        self.max_norm = float(table[N_SPECIAL:].norm(dim=1).max())
        self.additions = form.additions
        self.query = query
        self.candidates = candidates
        self.fallbacks = 0  # rows ranked again from float32 scores (not certified)

    def _queries(self, seq: torch.Tensor) -> torch.Tensor:
        q = self.query(seq).float()  # (B, D)
        return torch.cat([q, torch.ones_like(q[:, :1])], 1) if self.biased else q

    def exact_scores(self, q: torch.Tensor) -> torch.Tensor:
        """The float32 scores of queries q (B, D') over the whole catalog, specials at -inf. -> (B, V)"""
        s = q @ self.table.T
        s[:, :N_SPECIAL] = float("-inf")
        return s

    def coarse_scores(self, q: torch.Tensor) -> torch.Tensor:
        """bfloat16 scores of queries q (B, D') over the whole catalog, specials at -inf. -> (B, V)"""
        s = q.to(torch.bfloat16) @ self.coarse.T
        s[:, :N_SPECIAL] = float("-inf")
        return s

    def bound(self, q: torch.Tensor) -> torch.Tensor:
        """Per query, how far any coarse score may lie from the float32 one. (B, D') -> (B,)"""
        return ERROR * q.norm(dim=1) * self.max_norm

    def __call__(
        self,
        seq: torch.Tensor,
        k: int,
        *,
        seen: torch.Tensor | None,
        future: torch.Tensor | None,
        requested: torch.Tensor | None,
        blocked: torch.Tensor | None = None,
        floor: Popular | None = None,
    ) -> Ranked:
        q = self._queries(seq)  # (B, D')
        ex = exclude(
            self.coarse_scores(q), seen=seen, future=future, requested=requested, blocked=blocked, in_place=True
        )
        reference = floor.among(ex.scores) if floor is not None else None  # its -inf are the exclusions
        m = min(max(k, self.candidates), self.table.size(0))
        coarse, cand = top_k(ex.scores, m)  # (B, m), best first
        exact = torch.bmm(self.table[cand], q[:, :, None]).squeeze(2)  # (B, m)
        exact = exact.masked_fill(torch.isinf(coarse), float("-inf"))  # excluded stays excluded
        added = None
        if self.additions is not None:
            # Every item with an addition is a candidate too, so an item left out has none, and the
            # certificate below holds for it unchanged.
            items, add = added = self.additions(seq)  # (B, W), (B, W)
            match = cand[:, :, None] == items[:, None, :]  # (B, m, W)
            exact = exact + (match * add[:, None, :]).sum(2)
            extra = torch.bmm(self.table[items], q[:, :, None]).squeeze(2) + add  # (B, W)
            # Not twice (already a candidate), and not an excluded item or a special.
            gone = match.any(1) | torch.isinf(ex.scores.gather(1, items))
            exact = torch.cat([exact, extra.masked_fill(gone, float("-inf"))], 1)
            cand = torch.cat([cand, items], 1)
        values, pos = exact.topk(min(k, m), dim=1)
        indices = cand.gather(1, pos)
        # Every item left out has a coarse score <= the last candidate's, so an exact score of at most
        # that plus the bound. When the last candidate is -inf, every live item was rescored.
        left_out = coarse[:, -1].float()
        certified = torch.isinf(left_out) | (values[:, -1] > left_out + self.bound(q))
        if not bool(certified.all()):
            redo = (~certified).nonzero().squeeze(1)
            scores = self.exact_scores(q[redo])
            if added is not None:
                scores.scatter_add_(1, added[0][redo], added[1][redo])
            again = rank_sparse(
                scores,
                k,
                seen=None if seen is None else seen[redo],
                future=None if future is None else future[redo],
                requested=None if requested is None else requested[redo],
                blocked=None if blocked is None else (blocked if blocked.dim() == 1 else blocked[redo]),
            )
            values[redo], indices[redo] = again.scores, again.indices
            self.fallbacks += len(redo)
        return Ranked(indices, values, ex.n_seen, ex.n_future, ex.n_requested, reference, ex.n_blocked)


def _best_of(fn: Callable[[torch.Tensor], object], seq: torch.Tensor, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn(seq)
        best = min(best, time.perf_counter() - t)
    return best


def wide_ranker(
    model: SequentialRecommender, query: QueryFn, example: torch.Tensor, *, min_speedup: float | None = None
) -> tuple[SeqRanker | None, str]:
    """A CoarseRanker for a float32 model on the CPU when its coarse scores stay within the bound on
    `example` (B, L) and it ranks at least `min_speedup` (default MIN_SPEEDUP) times faster there;
    else None. -> (ranker, why)."""
    form = model.dot_form()
    if form is None or form.table.device.type != "cpu" or form.table.dtype != torch.float32:
        return None, "float32 scores"
    min_speedup = MIN_SPEEDUP if min_speedup is None else min_speedup
    ranker = CoarseRanker(model, query)
    with torch.inference_mode():
        q = ranker._queries(example)
        exact, coarse = ranker.exact_scores(q), ranker.coarse_scores(q).float()
        live = torch.isfinite(exact)
        if not bool(((coarse - exact).abs()[live] <= ranker.bound(q)[:, None].expand_as(exact)[live]).all()):
            return None, "float32 scores (this CPU's bfloat16 products exceed the coarse bound)"
        slow = _best_of(lambda s: top_k(ranker.exact_scores(ranker._queries(s)), 10), example)
        fast = _best_of(lambda s: ranker(s, 10, seen=None, future=None, requested=None), example)
    if slow < min_speedup * fast:
        return None, f"float32 scores (coarse ranking {slow / fast:.2f}x at load)"
    return ranker, f"coarse bfloat16 ranking, certified exact ({slow / fast:.1f}x at load)"
