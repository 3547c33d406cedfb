"""Ranking metrics over held-out targets (full ranking or sampled negatives, HR/NDCG/MRR@K) and the
simple baselines every recommendation run is measured against, through the same code."""

from __future__ import annotations

import itertools
import logging
import math
import time
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from models.ids import N_SPECIAL, PAD
from models.layers import last_valid_index
from models.ranking import index_mask, pack_histories, pad_rows
from models.transitions import flatten, merge_counts, pair_counts
from training.distributed import ONE_PROCESS, Dist
from training.splits import EvalSet

log = logging.getLogger(__name__)
LOG_EVERY_S = 30.0  # a progress line at least this often during a long evaluation
KS = (1, 5, 10)
PROTOCOLS = ("full", "popularity", "uniform")
ScoreFn = Callable[[torch.Tensor], torch.Tensor]  # (B, L) histories -> (B, V) scores


@dataclass(frozen=True)
class Protocol:
    """How held-out targets are ranked."""

    negatives: str = "full"  # full: against every item; popularity / uniform: against sampled negatives
    n_negatives: int = 100  # sampled protocols: negatives per target, among items the user never touched
    exclude_seen: bool = True  # full ranking: the user's earlier items are not candidates
    batch_size: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        if self.negatives not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.negatives!r}; one of {PROTOCOLS}")


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


# Users per scored batch at most this many (user, item) cells: each batch holds a few (B, V) tensors
# (scores, candidates, comparisons), which at 1M items and hundreds of users a batch exhaust memory.
EVAL_CELLS = 32 * 1024 * 1024


def rows_per_batch(protocol: Protocol, vocab_size: int) -> int:
    """protocol.batch_size, fewer on catalogs so large that a batch's (B, V) tensors would be gigabytes."""
    return max(1, min(protocol.batch_size, EVAL_CELLS // max(1, vocab_size)))


class _Progress:
    """When a progress line is due over `total` users (or items): at least every LOG_EVERY_S, never at
    the start."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.t0 = self.last = time.monotonic()

    def due(self, done_users: int) -> tuple[float, float] | None:
        """-> (share done, seconds spent) when a line is due, else None."""
        now = time.monotonic()
        if not done_users or now - self.last < LOG_EVERY_S:
            return None
        self.last = now
        return done_users / self.total, now - self.t0


# From this catalog size on, negatives are drawn by rejection: the masking draw holds a (B, V) float64
# copy of the weights, which grows with the catalog and is slow to draw from.
REJECTION_FROM = 200_000


def _draw_by_masking(interacted: list[list[int]], weights: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    touched = index_mask(pad_rows(interacted), len(weights))
    probs = weights[None, :].expand(len(touched), -1).masked_fill(touched, 0.0)
    if int((probs > 0).sum(1).min()) < n:
        # multinomial would silently draw zero-weight (interacted) items instead
        raise ValueError(f"a user has fewer than {n} items left to sample negatives from")
    return torch.multinomial(probs, n, replacement=False, generator=gen)


def _draw_by_rejection(
    interacted: list[list[int]], weights: torch.Tensor, n: int, gen: torch.Generator
) -> torch.Tensor:
    """The same distribution as _draw_by_masking: successive draws by weight, each skipping the user's
    items and the items drawn before it (what sampling without replacement is), vectorised: draws
    with replacement, in order, keep the first n that are neither touched nor repeated."""
    rows = pad_rows(interacted).sort(dim=1).values  # (B, S), each row's items ascending (PAD first)
    b, out = len(interacted), torch.empty(len(interacted), n, dtype=torch.long)
    todo = torch.arange(b)
    for _ in range(20):
        m = 2 * n + 16
        cand = torch.multinomial(weights, len(todo) * m, replacement=True, generator=gen).view(len(todo), m)
        mine = rows[todo]
        touched = mine.gather(1, torch.searchsorted(mine, cand).clamp(max=mine.size(1) - 1)) == cand
        srt, order = cand.sort(dim=1, stable=True)
        first = torch.ones_like(cand, dtype=torch.bool)
        first[:, 1:] = srt[:, 1:] != srt[:, :-1]
        repeat = torch.empty_like(first).scatter_(1, order, ~first)  # a later copy of an earlier draw
        keep = ~touched & ~repeat
        enough = keep.sum(1) >= n
        kept = keep & (keep.cumsum(1) <= n)
        out[todo[enough]] = cand[enough][kept[enough]].view(-1, n)
        todo = todo[~enough]
        if not len(todo):
            return out
    raise ValueError(f"a user has too few items left to sample {n} negatives from (by rejection)")


@dataclass(frozen=True)
class SparseScores:
    """(B, V) scores held as one row shared by every user plus a few entries per user: how the baselines
    score. Ranked without building the (B, V) tensor, whose passes were two thirds of a test on a
    500k-item catalog (docs/decisions/job-budget.md)."""

    base: torch.Tensor  # (V,) float32, the specials -inf
    sorted_base: torch.Tensor  # (V,) base ascending, to count the items at or above a score
    keys: torch.Tensor  # (n,) distinct row * V + item, ascending: the entries that differ from base
    values: torch.Tensor  # (n,) the score at each key
    rows: int

    @classmethod
    def of(
        cls,
        base: torch.Tensor,
        sorted_base: torch.Tensor,
        rows: int,
        entries: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        *,
        distinct: bool = False,
    ) -> SparseScores:
        """entries: (row, item, addition) triples, flat; additions to one cell are summed onto base in
        the triples' order (the order a dense scatter_add_ adds them, so the same float sums).
        distinct: the triples come one per cell, by row then item (no sort needed)."""
        row, item, add = entries
        v = len(base)
        if distinct:
            return cls(base, sorted_base, row * v + item, base[item] + add.float(), rows)
        keys, inverse = torch.unique(row * v + item, return_inverse=True)
        return cls(base, sorted_base, keys, base[keys % v].index_add(0, inverse, add.float()), rows)

    def at(self, cols: torch.Tensor) -> torch.Tensor:
        """The scores at (B, C) item columns -> (B, C)."""
        v = len(self.base)
        out = self.base[cols]
        if len(self.keys):
            q = torch.arange(len(cols))[:, None] * v + cols  # (B, C)
            pos = torch.searchsorted(self.keys, q).clamp_(max=len(self.keys) - 1)
            out = torch.where(self.keys[pos] == q, self.values[pos], out)
        return out

    def count_at_least(self, t: torch.Tensor) -> torch.Tensor:
        """How many items of each row score at least t (B,) -> (B,) long."""
        v = len(self.base)
        n = v - torch.searchsorted(self.sorted_base, t, side="left")  # items whose base is >= t
        if len(self.keys):
            row, item = self.keys // v, self.keys % v
            moved = (self.values >= t[row]).long() - (self.base[item] >= t[row]).long()  # entries off base
            n = n.index_add(0, row, moved)
        return n

    def dense(self) -> torch.Tensor:
        out = self.base.repeat(self.rows, 1)  # (B, V)
        out.view(-1)[self.keys] = self.values
        return out


class SparseScorer:
    """A baseline: called, (B, V) dense scores like any ScoreFn; `sparse()` gives them as SparseScores,
    which `evaluate_all` ranks without the dense tensor. entries: (B, L) histories -> (row, item,
    addition) triples on top of `base` (V,); `distinct` when they come one per cell, by row then item."""

    def __init__(
        self,
        base: torch.Tensor,
        entries: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        *,
        distinct: bool = False,
    ) -> None:
        self.base = base.float().clone()
        self.base[:N_SPECIAL] = -math.inf
        self.sorted_base = self.base.sort().values
        self.entries, self.distinct = entries, distinct

    def sparse(self, seq: torch.Tensor) -> SparseScores:
        entries = self.entries(seq.cpu())
        return SparseScores.of(self.base, self.sorted_base, len(seq), entries, distinct=self.distinct)

    def __call__(self, seq: torch.Tensor) -> torch.Tensor:
        return self.sparse(seq).dense().to(seq.device)


Scores = torch.Tensor | SparseScores


def _at(scores: Scores, cols: torch.Tensor) -> torch.Tensor:
    return scores.at(cols) if isinstance(scores, SparseScores) else scores.gather(1, cols)


def _count_at_least(scores: Scores, t: torch.Tensor) -> torch.Tensor:
    if isinstance(scores, SparseScores):
        return scores.count_at_least(t)
    # An int32 sum: faster than count_nonzero here (docs/decisions/job-budget.md); V < 2**31.
    return (scores >= t[:, None]).sum(1, dtype=torch.int32).long()


def _full_ranks(scores: Scores, targets: torch.Tensor, hist: torch.Tensor, *, exclude_seen: bool) -> torch.Tensor:
    """target_ranks over every item but the specials (and the row's distinct earlier items when
    `exclude_seen`), without a (B, V) candidate mask: the items at or above the target's score are
    counted once, then what must not count is subtracted. scores: (B, V) or sparse; targets: (B,);
    hist: (B, S) padded histories."""
    t = _at(scores, targets[:, None])  # (B, 1)
    specials = torch.arange(N_SPECIAL).expand(len(targets), -1)
    ranks = _count_at_least(scores, t[:, 0]) - (_at(scores, specials) >= t).count_nonzero(1) - 1  # the target itself
    if exclude_seen:
        srt = hist.sort(dim=1).values  # (B, S)
        counted = (srt >= N_SPECIAL) & (srt != targets[:, None])
        counted[:, 1:] &= srt[:, 1:] != srt[:, :-1]  # each distinct item once
        ranks = ranks - ((_at(scores, srt) >= t) & counted).count_nonzero(1)
    return ranks


@dataclass
class Evaluated:
    """evaluate_all's result: metrics[scorer][protocol], over the first `users` of `of` targets."""

    metrics: dict[str, dict[str, dict[str, float]]]
    users: int
    of: int
    seconds: float


def evaluate_all(
    scorers: dict[str, ScoreFn],
    data: EvalSet,
    *,
    protocols: list[Protocol],
    vocab_size: int,
    max_history: int,
    popularity: torch.Tensor | None = None,
    deadline: float | None = None,
    device: torch.device | str = "cpu",
) -> Evaluated:
    """Every scorer under every protocol on the same users, batch by batch in `data`'s order (give a
    shuffled sample): each scorer scores a batch once for all protocols, and a sampled protocol's
    negatives are drawn per batch, shared by the scorers (the draws `draw_negatives` makes).

    deadline: a time.monotonic() value; the evaluation stops after the first batch that ends past it,
    so every scorer is measured on the same users (at least one batch), and `users` says how many.
    """
    t0 = time.monotonic()
    bs = min(rows_per_batch(p, vocab_size) for p in protocols) if protocols else 1
    weights = {}
    for p in protocols:
        if p.negatives != "full":
            w = torch.ones(vocab_size) if p.negatives != "popularity" else popularity
            if w is None:
                raise ValueError("popularity sampling needs item counts")
            weights[p] = w.double().clone()
            weights[p][:N_SPECIAL] = 0
    gens = {p: torch.Generator().manual_seed(p.seed) for p in weights}
    draw = _draw_by_rejection if vocab_size >= REJECTION_FROM else _draw_by_masking
    n_targets, done = len(data.targets), 0
    # Filled in place: a small tensor kept per batch would split the heap's freed blocks, which then
    # no longer fit the next batch's scores, and the heap would grow (docs/decisions/reuse-freed-memory.md).
    ranks = {s: {p: torch.zeros(n_targets, dtype=torch.long) for p in protocols} for s in scorers}
    progress = _Progress(n_targets)
    while done < n_targets:
        if due := progress.due(done):
            share, spent = due
            log.info("evaluating: %.0f%% of %d users, %.0f users/s", 100 * share, n_targets, done / spent)
        hist = data.histories[done : done + bs]
        seq = pack_histories(hist, max_history).to(device)
        targets = torch.tensor(data.targets[done : done + bs])
        padded = pad_rows(hist)
        drawn = {p: draw(data.interacted[done : done + bs], weights[p], p.n_negatives, gens[p]) for p in weights}
        for name, score_fn in scorers.items():
            with torch.inference_mode():
                scores: Scores  # a baseline: ranked from its sparse form
                scores = score_fn.sparse(seq) if isinstance(score_fn, SparseScorer) else score_fn(seq).float().cpu()
            for p in protocols:
                if p.negatives == "full":
                    r = _full_ranks(scores, targets, padded, exclude_seen=p.exclude_seen)
                else:
                    r = (_at(scores, drawn[p]) >= _at(scores, targets[:, None])).count_nonzero(1)
                ranks[name][p][done : done + len(hist)] = r
        done += len(hist)
        if deadline is not None and time.monotonic() >= deadline:
            break
    metrics: dict[str, dict[str, dict[str, float]]] = {}
    for name, by_protocol in ranks.items():
        metrics[name] = {}
        for p, got in by_protocol.items():
            m = metrics_from_ranks(got[:done]) if done else {}
            m["n"] = float(done)
            metrics[name][p.negatives] = m
    return Evaluated(metrics, done, n_targets, time.monotonic() - t0)


def pooled(got: Evaluated, dist: Dist) -> Evaluated:
    """Every rank's evaluation of its own users as one, on rank 0 (the others keep theirs), where each
    rank holds its own users (else `got`, already everyone's): each figure the mean over every rank's
    users, `users` and `of` summed, `seconds` the slowest rank's. Every rank scores the same scorers
    under the same protocols; a rank without users adds nothing."""
    if not dist.own_data:
        return got
    names = [*(f"{m}@{k}" for k in KS for m in ("HR", "NDCG")), "MRR"]
    cells = [(s, p, m) for s, by in got.metrics.items() for p in by for m in names]
    sums = [got.metrics[s][p].get(m, 0.0) * got.users for s, p, m in cells]
    parts = dist.gather(torch.tensor([*sums, got.users, got.of, got.seconds], dtype=torch.float64))
    if not dist.is_main:
        return got
    total = torch.stack(parts).sum(0).tolist()
    users, of = int(total[-3]), int(total[-2])
    metrics: dict[str, dict[str, dict[str, float]]] = {s: {p: {} for p in by} for s, by in got.metrics.items()}
    for (s, p, m), v in zip(cells, total, strict=False):
        metrics[s][p][m] = v / max(users, 1)
    for by_protocol in metrics.values():
        for figures in by_protocol.values():
            figures["n"] = float(users)
    return Evaluated(metrics, users, of, max(float(part[-1]) for part in parts))


def evaluate(
    score_fn: ScoreFn,
    data: EvalSet,
    *,
    vocab_size: int,
    max_history: int,
    protocol: Protocol,
    popularity: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """One scorer under one protocol: `evaluate_all`'s figures for it (empty without targets)."""
    if not data.targets:
        return {}
    got = evaluate_all(
        {"scorer": score_fn},
        data,
        protocols=[protocol],
        vocab_size=vocab_size,
        max_history=max_history,
        popularity=popularity,
        device=device,
    )
    return got.metrics["scorer"][protocol.negatives]


# --- baselines -------------------------------------------------------------------------------------


def item_counts(sequences: list[list[int]], vocab_size: int) -> torch.Tensor:
    return torch.bincount(flatten(sequences)[0], minlength=vocab_size)[:vocab_size]


def _tie_break(counts: torch.Tensor) -> torch.Tensor:
    """Popularity scaled into [0, 1): added to integer counts, it orders ties without overtaking them."""
    c = counts.double()
    return (c / (c.max() + 1.0)).float()


# The baselines take the ranks as `dist`: where each rank holds its own users (`dist.own_data`), every
# rank fits the same baseline from all of theirs, counts added up (docs/decisions/rank-shares.md);
# otherwise `known` is the whole log.


def popularity_scorer(known: list[list[int]], vocab_size: int, dist: Dist = ONE_PROCESS) -> SparseScorer:
    """Every user gets each item's count in `known` (log-scaled)."""
    return SparseScorer(torch.log1p(dist.total(item_counts(known, vocab_size)).float()), _no_entries)


def _no_entries(seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    empty = torch.zeros(0, dtype=torch.long)
    return empty, empty, torch.zeros(0)


@dataclass(frozen=True)
class _Rows:
    """A sparse matrix by rows (CSR arrays), for gathering whole rows at once."""

    crow: torch.Tensor  # (n + 1,) start of each row
    col: torch.Tensor
    val: torch.Tensor


def _row_entries(m: _Rows, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The nonzero entries of the given rows, without a loop over rows: -> (index into `rows`, column,
    value), by row then column."""
    crow, col, val = m.crow, m.col, m.val
    starts, lens = crow[rows], crow[rows + 1] - crow[rows]
    total = int(lens.sum())
    row_id = torch.repeat_interleave(torch.arange(len(rows)), lens)
    offset = torch.arange(total) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
    pos = starts[row_id] + offset
    return row_id, col[pos], val[pos]


PAIR_RANGE = 4_000_000  # (item, next item) pairs summed over the ranks at once, every rank's together


def summed_pair_counts(
    sequences: list[list[int]], vocab_size: int, dist: Dist = ONE_PROCESS
) -> tuple[torch.Tensor, torch.Tensor]:
    """`pair_counts` of `sequences`; where each rank holds its own users, of every rank's, added up on
    every rank (the table's rows are the catalog's, not a user's: its memory is the distinct pairs)."""
    keys, counts = pair_counts(sequences, vocab_size)
    if not dist.own_data:
        return keys, counts
    # By ranges of keys, the same on every rank: the gathered parts and their merge's sort are a
    # range's, not the table's (every rank keeps the whole table: it ends at twice its size, as the
    # ranges' results are joined).
    ranges = max(1, math.ceil(int(dist.total(torch.tensor([len(keys)])).item()) / PAIR_RANGE))
    bounds = torch.tensor([vocab_size * vocab_size * r // ranges for r in range(ranges + 1)])
    at = torch.searchsorted(keys, bounds).tolist()
    parts = []
    for a, b in itertools.pairwise(at):
        got = torch.cat(dist.gather(keys[a:b], everywhere=True)), torch.cat(dist.gather(counts[a:b], everywhere=True))
        parts.append(merge_counts(*got))
        del got
    del keys, counts
    return torch.cat([k for k, _ in parts]), torch.cat([c for _, c in parts])


def transitions_scorer(known: list[list[int]], vocab_size: int, dist: Dist = ONE_PROCESS) -> SparseScorer:
    """First-order item transitions: for the history's last item, the items that followed it most
    often in `known`; popularity fills (and orders ties)."""
    # Counted by one unique over (item, next item) keys: sorted by item, then next item, as a
    # coalesced sparse matrix would be, and faster than coalescing one on a large log.
    keys, counts = summed_pair_counts(known, vocab_size, dist)
    starts = _row_starts(torch.bincount(keys // vocab_size, minlength=vocab_size))
    trans = _Rows(starts, keys % vocab_size, counts.float())

    def entries(seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _row_entries(trans, seq.gather(1, last_valid_index(seq)[:, None]).squeeze(1))

    popularity = _tie_break(dist.total(item_counts(known, vocab_size)))
    return SparseScorer(popularity, entries, distinct=True)  # one row each


KNN_BLOCK_PAIRS = 20_000_000  # (item, user, item) products per block of items: bounds item-kNN's memory


def _row_starts(counts: torch.Tensor) -> torch.Tensor:
    """(n + 1,) where each of n rows starts in a by-row list of entries, from each row's count."""
    crow = torch.zeros(len(counts) + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(counts, 0)
    return crow


def _csr(crow: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():  # "sparse CSR support is in beta": item-kNN uses its product only
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols, vals, shape, check_invariants=False)


def _top_per_row(key: torch.Tensor, crow: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of each CSR row's k largest `key`s (every position of a row with k or fewer), without
    a loop over rows: rows longer than k are padded to the next power of two, in one `topk` a width."""
    lens = crow[1:] - crow[:-1]
    short = lens <= k
    out = [torch.nonzero(torch.repeat_interleave(short, lens)).squeeze(1)]
    long_rows = torch.nonzero(~short).squeeze(1)
    if len(long_rows):
        width = torch.ceil(torch.log2(lens[long_rows].double())).long()
        for w in torch.unique(width).tolist():
            rows = long_rows[width == w]
            offsets = torch.arange(2**w)
            at = crow[rows][:, None] + offsets  # (R, 2**w)
            padded = torch.where(offsets < lens[rows][:, None], key[at.clamp(max=len(key) - 1)], -1)
            out.append((crow[rows][:, None] + torch.topk(padded, k, dim=1, sorted=False).indices).reshape(-1))
    return torch.cat(out)


def _knn_neighbours(
    known: list[list[int]], vocab_size: int, neighbours: int, dist: Dist = ONE_PROCESS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each item's `neighbours` most similar items by cosine over users: (V, width) neighbour ids, by
    id, and their similarities; PAD and 0 where an item has fewer than the widest.

    The co-occurrence counts of a block of items are one sparse product (items x users) @ (users x
    items); each block is cut to its rows' top neighbours and written into the tables before the
    next, so the whole (V, V) co-occurrence (230 million pairs for 5M events, docs/BENCHMARKS.md, "How
    large a log can training read?") never exists at once. Ties go to the lower item id.
    Where each rank holds its own users, every rank multiplies its users' part of a block, the block's
    owner (ranks in turn) adds the parts up and cuts its rows, and the tables are summed at the end:
    the same tables as one process fitting all of them, each rank holding its users' events only.
    """
    # Each user's distinct items: one unique over (user, item) keys for all users at once.
    n_users = len(known)
    lengths = np.fromiter((len(s) for s in known), dtype=np.int64, count=n_users)
    flat = np.fromiter((x for s in known for x in s), dtype=np.int64, count=int(lengths.sum()))
    keys = torch.unique(torch.from_numpy(np.repeat(np.arange(n_users, dtype=np.int64), lengths) * vocab_size + flat))
    user_of, user_items = keys // vocab_size, keys % vocab_size
    sizes = torch.bincount(user_of, minlength=n_users)
    own_n = torch.bincount(user_items, minlength=vocab_size)
    everyone = int(dist.total(torch.tensor([n_users])).item())
    # Counts are sums of ones: exact in float32 below 2**24 users.
    ones = torch.ones(len(keys), dtype=torch.float32 if everyone < 2**24 else torch.float64)
    users_items = _csr(_row_starts(sizes), user_items, ones, (n_users, vocab_size))
    by_item = torch.argsort(user_items, stable=True)
    item_users, item_start = user_of[by_item], _row_starts(own_n)
    # Blocks are cut by every rank's products, so that all ranks cut the same blocks.
    # .double(): bincount gives int64 for no users whatever the weights, and a rank without users in the
    # sample would all-reduce int64 bits against float64 ones.
    products = dist.total(torch.bincount(user_items, weights=sizes[user_of].double(), minlength=vocab_size).double())
    products = torch.cumsum(products, 0)
    nf = dist.total(own_n).float()
    del flat, keys, user_of, by_item  # what the blocks do not read: their memory serves the blocks'
    nbr = torch.full((vocab_size, max(neighbours, 1)), PAD, dtype=torch.long)
    nsim = torch.zeros(vocab_size, max(neighbours, 1))
    lo, turn = 0, 0
    progress = _Progress(vocab_size)
    while lo < vocab_size:
        if due := progress.due(lo):  # 500k items: a minute of fitting
            done, spent = due
            eta = spent / done - spent
            log.info("fitting item_knn: %.0f%% of %d items, about %.0fs left", 100 * done, vocab_size, eta)
        before = float(products[lo - 1]) if lo else 0.0
        hi = int(torch.searchsorted(products, before + KNN_BLOCK_PAIRS, right=True))
        hi = min(max(hi, lo + 1), vocab_size)
        a, b = int(item_start[lo]), int(item_start[hi])
        block = _csr(item_start[lo : hi + 1] - a, item_users[a:b], ones[a:b], (hi - lo, n_users))
        co = _block_cooccurrence(block, users_items, dist=dist, owner=turn % dist.world)
        del block
        if co is not None:  # this rank's block (every block, in one process)
            rows, pos, ids, sims = _block_neighbours(*co, lo=lo, nf=nf, neighbours=neighbours)
            nbr[rows, pos], nsim[rows, pos] = ids, sims
            del rows, pos, ids, sims
        del co  # before the next block's product is made: two never coexist
        lo, turn = hi, turn + 1
    if dist.own_data:  # each row was written by its block's owner alone, PAD (0) and 0 on the others
        nbr, nsim = dist.all_reduce(nbr), dist.all_reduce(nsim)
    width = int((nbr != PAD).sum(1).max()) if vocab_size else 0
    if width < nbr.size(1):  # a small catalog: fewer neighbours than asked for
        nbr, nsim = nbr[:, : max(width, 1)].clone(), nsim[:, : max(width, 1)].clone()
    return nbr, nsim


def _block_cooccurrence(
    block: torch.Tensor, users_items: torch.Tensor, *, dist: Dist, owner: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """A block's co-occurrence counts (item x user CSR `block` @ `users_items`) as CSR arrays (row
    starts, columns, counts); where each rank holds its own users, every rank's added up on `owner`
    (the other ranks get None)."""
    co = torch.sparse.mm(block, users_items)  # (hi - lo, V) CSR
    crow, col, counts = co.crow_indices(), co.col_indices(), co.values()
    if not dist.own_data:
        return crow, col, counts
    n_rows, vocab_size = block.size(0), users_items.size(1)
    keys = torch.repeat_interleave(torch.arange(n_rows), crow[1:] - crow[:-1]) * vocab_size + col
    del co, crow, col  # sent as (row, column) keys: one int64 an entry
    key_parts = dist.gather(keys, to=owner)
    count_parts = dist.gather(counts, to=owner)
    del keys, counts
    if dist.rank != owner:
        return None
    keys, counts = merge_counts(torch.cat(key_parts), torch.cat(count_parts))
    del key_parts, count_parts
    return _row_starts(torch.bincount(keys // vocab_size, minlength=n_rows)), keys % vocab_size, counts


def _block_neighbours(
    crow: torch.Tensor, j: torch.Tensor, counts: torch.Tensor, *, lo: int, nf: torch.Tensor, neighbours: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The top neighbours of a block of items (rows lo.. of the co-occurrence counts, CSR arrays), by
    cosine: -> (item ids, their places 0.. in the item's row, neighbour ids, similarities). A function
    of its own so that the block's by-entry copies are freed when it returns."""
    vocab_size = len(nf)
    i = torch.repeat_interleave(torch.arange(lo, lo + len(crow) - 1), crow[1:] - crow[:-1])
    sim = counts.float() / torch.sqrt(nf[i] * nf[j]).clamp(min=1.0)
    # One int64 orders a row's entries: the similarity, then the lower neighbour id (a non-negative
    # float32's bits order as the float does). The item itself gets -1: it loses to every neighbour.
    key = (sim.view(torch.int32).long() << 32) | (0xFFFFFFFF - j)
    key[i == j] = -1
    top = _top_per_row(key, crow, neighbours)
    top = top[key[top] >= 0]
    top = top[torch.argsort((i[top] - lo) * vocab_size + j[top])]  # by row, then neighbour id
    rows = i[top]
    per_row = torch.bincount(rows - lo, minlength=len(crow) - 1)
    start = torch.cumsum(per_row, 0) - per_row
    return rows, torch.arange(len(top)) - start[rows - lo], j[top], sim[top]


def item_knn_scorer(
    known: list[list[int]], vocab_size: int, dist: Dist = ONE_PROCESS, *, neighbours: int = 100
) -> SparseScorer:
    """Item-to-item co-occurrence (item-kNN): each item keeps its `neighbours` most similar items by
    cosine over the users of `known`; a candidate scores its summed similarity to the history's items
    (popularity orders ties)."""
    nbr, nsim = _knn_neighbours(known, vocab_size, neighbours, dist)

    def entries(seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = nbr[seq]  # (B, L, K)
        # Missing neighbours are PAD, and so are all of PAD's (padding positions): they would only add
        # 0 to the PAD cell. Left out, as most of a padded batch's entries (Beauty: about 9 items a
        # history of 50 positions).
        keep = ids != PAD
        rows = torch.arange(len(seq))[:, None, None].expand_as(ids)
        return rows[keep], ids[keep], nsim[seq][keep]

    return SparseScorer(_tie_break(dist.total(item_counts(known, vocab_size))) * 1e-3, entries)


class BaselineFit(typing.Protocol):
    def __call__(self, known: list[list[int]], vocab_size: int, dist: Dist = ONE_PROCESS) -> SparseScorer: ...


BASELINES: dict[str, BaselineFit] = {
    "popularity": popularity_scorer,
    "transitions": transitions_scorer,
    "item_knn": item_knn_scorer,
}

# Seconds each user's history adds to a baseline's fit on the 2-core reference box, for the baselines
# whose fit grows faster than the log: item-kNN's (item, user, item) products, about 45 million a second
# over a 500k-item catalog (1.2 billion: 26-28 s) and 100 million over 50k items (474 million: 4.7 s).
# Popularity and transitions cost about what reading the log does, and are always fitted on everyone.
FIT_SECONDS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "item_knn": lambda n: n.astype(np.float64) ** 2 / 40e6,
}


def fit_baseline(
    name: str,
    known: list[list[int]],
    vocab_size: int,
    *,
    seconds: float | None = None,
    seed: int = 0,
    dist: Dist = ONE_PROCESS,
) -> tuple[SparseScorer, int]:
    """A baseline fitted on `known`, or, for one in FIT_SECONDS, on a seeded random sample of its users
    when fitting them all would take longer than `seconds` (None: all); -> (scorer, users fitted on).
    Where each rank holds its own users, the ranks fit it together on one sample of all of theirs,
    sized as one process's would be (`seconds` must be the same on every rank)."""
    cost = FIT_SECONDS.get(name)
    lengths = np.fromiter(map(len, known), dtype=np.int64, count=len(known))
    per_user = torch.from_numpy(cost(lengths) if cost is not None else np.zeros(len(known)))
    everyone = int(dist.total(torch.tensor([len(known)])).item())
    total = float(dist.total(per_user.sum().reshape(1)).item())
    if seconds is None or total <= seconds:
        return BASELINES[name](known, vocab_size, dist), everyone
    # Each user draws a key; the lowest keys whose fit fits `seconds`, over every rank's users, are kept.
    # float64: 2M float32 keys would share about 100k values.
    stream = torch.Generator().manual_seed(seed * 1_000_003 + (dist.rank if dist.own_data else 0))
    key = torch.rand(len(known), dtype=torch.float64, generator=stream)
    keys, costs = key, per_user
    if dist.own_data:
        keys, costs = torch.cat(dist.gather(key, everywhere=True)), torch.cat(dist.gather(per_user, everywhere=True))
    order = torch.argsort(keys)
    keep = max(1, int(torch.searchsorted(torch.cumsum(costs[order], 0), seconds, right=True)))
    mine = torch.nonzero(key <= keys[order[keep - 1]]).squeeze(1).tolist()
    log.info(
        "fitting %s on %d of %d users (a seeded sample; %d of them here): all would take about %.0f s",
        name,
        keep,
        everyone,
        len(mine),
        total,
    )
    return BASELINES[name]([known[u] for u in mine], vocab_size, dist), keep
