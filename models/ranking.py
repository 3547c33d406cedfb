"""Ranking with exclusions: pure tensor functions over a batch, no loop over users."""

from __future__ import annotations

import datetime as dt
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from models.base import SequentialRecommender
from models.ids import PAD, UNK

RELEASE_UNITS = ("year", "second")


def reference_value(timestamp: float, unit: str) -> float:
    """A unix timestamp expressed in the unit item release times are stored in."""
    if unit == "second":
        return float(timestamp)
    if unit == "year":
        return float(dt.datetime.fromtimestamp(timestamp, dt.UTC).year)
    raise ValueError(f"unknown release unit {unit!r}; expected one of {RELEASE_UNITS}")


def pack_histories(histories: list[list[int]], max_history: int) -> torch.Tensor:
    """Right-padded (B, L) batch of the most recent `max_history` items, L = longest kept.

    An empty history becomes [UNK] so that every row has a position to read from.
    """
    return pad_rows([h[-max_history:] if h else [UNK] for h in histories])


def pad_rows(rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """Right-pad index lists with PAD into a (B, max(1, longest)) long tensor."""
    # Filled in one C array and viewed as a tensor (torch.frombuffer keeps the array alive). torch.tensor
    # on padded Python lists pays per element, and the seen lists of a batch are padded to its longest
    # full history: a real share of a model call that way (docs/decisions/request-path-trims.md).
    width = max([1, *map(len, rows)])
    if not rows:
        return torch.zeros(0, width, dtype=torch.long)
    buf = array("q")
    padding = array("q", [PAD]) * width
    for r in rows:
        buf.extend(r)
        buf.extend(padding[: width - len(r)])
    return torch.frombuffer(buf, dtype=torch.long).view(len(rows), width)


def index_mask(indices: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool (B, V), True at each row's listed indices. indices: (B, S) padded with 0 or 1."""
    mask = torch.zeros(indices.size(0), vocab_size, dtype=torch.bool, device=indices.device)
    mask.scatter_(1, indices, True)
    mask[:, PAD] = False
    mask[:, UNK] = False
    return mask


def future_mask(release: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Items released after each row's reference time. release: (V,), -inf = always available;
    reference: (B,) -> (B, V) bool."""
    return release[None, :] > reference[:, None]


@dataclass
class Ranked:
    indices: torch.Tensor  # (B, k) item indices, best first
    scores: torch.Tensor  # (B, k); -inf where fewer than k items were left
    n_seen: torch.Tensor  # (B,) items removed as already seen
    n_future: torch.Tensor  # (B,) removed as not yet released (and not seen)
    n_requested: torch.Tensor  # (B,) removed on request (and neither seen nor future)
    floor: torch.Tensor | None = None  # (B, FLOOR_K) each row's reference list (Popular.top), PAD where short
    n_blocked: torch.Tensor | None = None  # (B,) removed by a business rule (hidden, filtered), after the others


FLOOR_K = 10  # a reference list's length: the online figures' K
FLOOR_HEAD = 512  # the most frequent entities a reference list is taken from


@dataclass(frozen=True)
class Popular:
    """A catalog's most frequent entities, most frequent first: the reference list each by-user answer is
    scored beside online (its floor, docs/decisions/sequential-tests.md) is the first FLOOR_K of them that
    the answer's own exclusions leave, read off the same ranking pass (`among`). Only the head is kept: a
    row that excludes nearly all of it gets a shorter list."""

    order: torch.Tensor  # (P,) long: entity indices, most frequent first
    at_end: torch.Tensor  # (P + 1,) long: `order` and PAD, which a row with fewer than FLOOR_K left reads
    wanted: torch.Tensor  # (FLOOR_K,) long: 1 .. FLOOR_K, the kept entities' ranks in the head

    @classmethod
    def of(cls, order: Sequence[int], device: torch.device | str = "cpu") -> Popular:
        head = torch.tensor(list(order), dtype=torch.long)
        at_end = torch.cat([head, torch.tensor([PAD])])
        return cls(head.to(device), at_end.to(device), torch.arange(1, FLOOR_K + 1, device=device))

    def among(self, masked: torch.Tensor) -> torch.Tensor:
        """Each row's first FLOOR_K entities of `order` whose score in `masked` (B, V) is finite: what the row's
        exclusions (seen, future, requested, specials: already -inf there) leave. -> (B, FLOOR_K) long, PAD
        past a short row's end. The j-th kept entity sits where the running count of kept ones first reaches j."""
        kept = torch.isfinite(masked.index_select(1, self.order)).cumsum(1)  # (B, P)
        at = torch.searchsorted(kept, self.wanted.expand(kept.size(0), -1).contiguous())  # (B, FLOOR_K), P: none
        return self.at_end[at]


def _distinct_live(idx: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Per row, how many distinct indices of `idx` (B, S) point at a finite score. -> (B,)."""
    s, _ = idx.sort(dim=1)
    first = torch.ones_like(s, dtype=torch.bool)
    first[:, 1:] = s[:, 1:] != s[:, :-1]
    return (first & torch.isfinite(scores.gather(1, s))).sum(1)


def _drop(scores: torch.Tensor, indices: torch.Tensor) -> None:
    """scores[b, indices[b, j]] = -inf for every b, j, in place. (B, V), (B, S)"""
    # An indexed assignment, not scatter_: on bfloat16 scores (models/coarse.py) scatter_ converts the
    # whole (B, V) tensor and back (docs/decisions/coarse-ranking.md).
    rows = torch.arange(scores.size(0), device=scores.device)[:, None]
    scores[rows, indices] = float("-inf")


@dataclass
class Excluded:
    scores: torch.Tensor  # (B, V): the scores with every excluded item at -inf
    n_seen: torch.Tensor  # (B,)
    n_future: torch.Tensor  # (B,)
    n_requested: torch.Tensor  # (B,)
    n_blocked: torch.Tensor | None = None  # (B,); None when no rule applied


def exclude(
    scores: torch.Tensor,
    *,
    seen: torch.Tensor | None,
    future: torch.Tensor | None,
    requested: torch.Tensor | None,
    blocked: torch.Tensor | None = None,
    in_place: bool = False,
) -> Excluded:
    """`scores` (B, V) with the seen, future and requested items at -inf, and how many each removed;
    in_place: write into `scores` itself instead of a copy.

    seen, requested: (B, S) long, padded with PAD (whose score is already -inf), or None when no
    row lists any (see index_rows); future: (B, V) bool or None; blocked: what business rules take
    out (hidden items, a query's filter: models/catalog.py), (B, V) or (V,) bool, or None. Items already at -inf
    (padding, unknown, [MASK]) are never returned as items; each exclusion is counted only where it
    removed an item the earlier ones had not. Index lists, not (B, V) masks: a few small ops in
    place of a dozen passes over (B, V), for a 54k-item catalog 1.5 ms instead of 5.8 ms for 16
    queries on one thread.
    """
    masked = scores if in_place else scores.clone()
    none = torch.zeros(scores.size(0), dtype=torch.long, device=scores.device)
    n_seen = n_future = n_requested = none
    if seen is not None:
        n_seen = _distinct_live(seen, masked)
        _drop(masked, seen)
    if future is not None:
        new = future & torch.isfinite(masked)
        n_future = new.sum(1)
        masked.masked_fill_(new, float("-inf"))
    if requested is not None:
        n_requested = _distinct_live(requested, masked)
        _drop(masked, requested)
    n_blocked = None
    if blocked is not None:
        new = blocked & torch.isfinite(masked)  # (B, V), a (V,) mask broadcast over the rows
        n_blocked = new.sum(1)
        masked.masked_fill_(new, float("-inf"))
    return Excluded(masked, n_seen, n_future, n_requested, n_blocked)


def rank_sparse(
    scores: torch.Tensor,
    k: int,
    *,
    seen: torch.Tensor | None,
    future: torch.Tensor | None,
    requested: torch.Tensor | None,
    blocked: torch.Tensor | None = None,
    floor: Popular | None = None,
) -> Ranked:
    """Top-k of `scores` (B, V) after removing the seen, future, requested and blocked items (exclude);
    with `floor`, each row's reference list under the same exclusions (Ranked.floor)."""
    ex = exclude(scores, seen=seen, future=future, requested=requested, blocked=blocked)
    values, indices = top_k(ex.scores, k)
    reference = floor.among(ex.scores) if floor is not None else None
    return Ranked(indices, values, ex.n_seen, ex.n_future, ex.n_requested, reference, ex.n_blocked)


class SeqRanker(Protocol):
    """Ranks a batch of packed histories (B, L) with its exclusions (and, with `floor`, each row's reference
    list under them): what `recommend` runs."""

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
    ) -> Ranked: ...


# Rows at least this wide find their top-k through the maxima of blocks of BLOCK items.
BLOCKED_FROM = 65_536
BLOCK = 256


def top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(scores, k, dim=1) for (B, V) scores: the same values, best first (among equal
    scores the indices may differ, as with topk itself).

    A wide row goes through its blocks' maxima: an item of the top k lies in a block whose maximum
    is among the k largest block maxima (fewer than k items beat it, so fewer than k blocks do), so
    the top k of those k blocks (plus the last, partial block) is the row's top k. One pass of amax
    and two small topk calls instead of topk over the whole row (docs/BENCHMARKS.md, "How large a
    catalog can one box serve?").
    """
    b, v = scores.shape
    k = min(k, v)
    if v < BLOCKED_FROM or k * BLOCK * 4 > v:
        return scores.topk(k, dim=1)
    n_blocks = v // BLOCK
    blocks = scores[:, : n_blocks * BLOCK].unflatten(1, (n_blocks, BLOCK))  # a view: (B, n_blocks, BLOCK)
    chosen = blocks.amax(dim=2).topk(k, dim=1).indices  # (B, k)
    offsets = torch.arange(BLOCK, device=scores.device)
    cand = blocks.gather(1, chosen[:, :, None].expand(b, k, BLOCK)).reshape(b, k * BLOCK)
    cand_idx = (chosen[:, :, None] * BLOCK + offsets).reshape(b, k * BLOCK)
    if v > n_blocks * BLOCK:
        cand = torch.cat([cand, scores[:, n_blocks * BLOCK :]], 1)
        rest = torch.arange(n_blocks * BLOCK, v, device=scores.device).expand(b, -1)
        cand_idx = torch.cat([cand_idx, rest], 1)
    values, pos = cand.topk(k, dim=1)
    return values, cand_idx.gather(1, pos)


def index_rows(rows: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> torch.Tensor | None:
    """pad_rows(rows) on `device`, or None when every row is empty: most queries request no exclusion,
    and counting a listed one takes 8 small ops (20-30 us of a ~1.2 ms batch-1 call on one CPU thread)."""
    return pad_rows(rows).to(device) if any(rows) else None


def release_tensor(raw_ids: list[str], release: dict[str, float]) -> torch.Tensor:
    """(V,) release times aligned to item indices; -inf (always available) where unknown.

    raw_ids: the item map's raw ids in index order from index 2.
    """
    out = torch.full((len(raw_ids) + 2,), float("-inf"))
    for idx, raw in enumerate(raw_ids, start=2):
        value = release.get(raw)
        if value is not None:
            out[idx] = value
    return out


def recommend(
    model: SequentialRecommender,
    histories: list[list[int]],
    *,
    k: int,
    exclude_seen: list[bool],
    requested: list[list[int]],
    release: torch.Tensor | None = None,
    reference: list[float | None] | None = None,
    device: torch.device | str = "cpu",
    scores: Callable[[torch.Tensor], torch.Tensor] | None = None,
    rank: SeqRanker | None = None,
    floor: Popular | None = None,
    blocked: torch.Tensor | None = None,
) -> Ranked:
    """One forward pass for a batch of histories, then exclusions and top-k.

    histories: item indices, oldest first (unknown items already dropped). reference: per row, the
    time in the release unit after which items count as future; None = no future exclusion.
    scores: what computes model.scores (a served engine's trace, models/traced.py); None = the model.
    rank: what scores and ranks instead (models/coarse.py for wide catalogs); None = scores, then
    rank_sparse. floor: each row's reference list is added (Ranked.floor), with the same exclusions.
    blocked: (B, V) or (V,) bool, what business rules take out (models/catalog.py).
    """
    seq = pack_histories(histories, model.max_history).to(device)
    # Rows that keep their seen items list nothing (PAD only).
    seen = index_rows([h if ex else [] for h, ex in zip(histories, exclude_seen, strict=True)], device)
    req = index_rows(requested, device)
    fut = None
    if release is not None and reference is not None:
        ref = torch.tensor([float("inf") if r is None else r for r in reference], device=device)
        fut = future_mask(release.to(device), ref)
    if rank is not None:
        return rank(seq, k, seen=seen, future=fut, requested=req, blocked=blocked, floor=floor)
    return rank_sparse(
        (scores or model.scores)(seq).float(), k, seen=seen, future=fut, requested=req, blocked=blocked, floor=floor
    )
