import math
from collections.abc import Sequence

import torch

from models.ids import PAD
from models.ranking import (
    BLOCK,
    BLOCKED_FROM,
    FLOOR_K,
    Popular,
    Ranked,
    future_mask,
    index_mask,
    pack_histories,
    pad_rows,
    rank_sparse,
    recommend,
    reference_value,
    release_tensor,
    top_k,
)
from models.sasrec import SASRec, SASRecConfig


def rank_by_masks(
    scores: torch.Tensor,
    k: int,
    *,
    seen: torch.Tensor | None = None,
    future: torch.Tensor | None = None,
    requested: torch.Tensor | None = None,
) -> Ranked:
    """The reference rank_sparse is held to: the exclusions as (B, V) bool masks, applied in turn."""
    live = torch.isfinite(scores)
    removed = torch.zeros_like(live)
    counts = []
    for m in (seen, future, requested):
        if m is None:
            counts.append(torch.zeros(scores.size(0), dtype=torch.long, device=scores.device))
            continue
        new = m & live & ~removed
        counts.append(new.sum(1))
        removed |= new
    masked = scores.masked_fill(removed, float("-inf"))
    k = min(k, scores.size(1))
    values, indices = masked.topk(k, dim=1)
    return Ranked(indices, values, counts[0], counts[1], counts[2])


def test_pack_histories_keeps_most_recent_and_fills_empty() -> None:
    t = pack_histories([[2, 3, 4, 5], [], [7]], max_history=3)
    assert t.tolist() == [[3, 4, 5], [1, 0, 0], [7, 0, 0]]


def test_pad_rows_right_pads_ragged_rows_with_padding() -> None:
    """Every shape the serving path builds: ragged rows, empty rows, one row, no row, tuples, int64 range."""
    gen = torch.Generator().manual_seed(0)
    cases: list[list[Sequence[int]]] = [[], [[]], [[], []], [[5]], [[2, 3], (4,), [], [9, 8, 7, 6]]]
    for b in (1, 8, 64):  # up to 700 items a row: full histories, as the seen exclusion pads them
        lengths = torch.randint(0, 700, (b,), generator=gen).tolist()
        cases.append([torch.randint(2, 10**6, (n,), generator=gen).tolist() for n in lengths])
    cases.append([[2**63 - 1, 2], [3]])
    for rows in cases:
        width = max([1, *map(len, rows)])
        t = pad_rows(rows)
        assert t.dtype == torch.long and t.shape == (len(rows), width)
        assert t.tolist() == [list(r) + [0] * (width - len(r)) for r in rows]


def test_index_mask_ignores_padding_and_unknown() -> None:
    m = index_mask(torch.tensor([[2, 4, 0], [1, 0, 0]]), 6)
    assert m.tolist() == [[False, False, True, False, True, False], [False] * 6]


def test_rank_exclusions_and_counts() -> None:
    scores = torch.tensor([[-math.inf, -math.inf, 5.0, 4.0, 3.0, 2.0, 1.0]])
    seen = torch.tensor([[2]])
    fut = torch.tensor([[False, False, True, True, False, False, False]])  # 2 is seen and future
    req = torch.tensor([[3, 4]])  # 3 is future and requested
    r = rank_sparse(scores, 10, seen=seen, future=fut, requested=req)
    finite = torch.isfinite(r.scores[0])
    assert r.indices[0][finite].tolist() == [5, 6]  # k beyond the candidates: only what is left
    assert (r.n_seen.item(), r.n_future.item(), r.n_requested.item()) == (1, 1, 1)


def test_future_mask_and_release_units() -> None:
    release = release_tensor(["a", "b", "c"], {"a": 1990.0, "c": 2001.0})  # b unknown: always available
    assert release[:2].tolist() == [-math.inf, -math.inf]
    m = future_mask(release, torch.tensor([1995.0, 2005.0]))
    assert m.tolist() == [[False, False, False, False, True], [False] * 5]
    assert reference_value(881250949, "year") == 1997.0
    assert reference_value(5.0, "second") == 5.0


def test_recommend_never_returns_seen_future_or_specials() -> None:
    torch.manual_seed(0)
    model = SASRec(SASRecConfig(vocab_size=12, max_len=8, d_model=8, n_heads=1, n_layers=1, d_ff=16)).eval()
    release = release_tensor([str(i) for i in range(10)], {"9": 2020.0})  # index 11 released 2020
    with torch.inference_mode():
        r = recommend(
            model,
            [[2, 3, 4], [5]],
            k=20,
            exclude_seen=[True, False],
            requested=[[6], []],
            release=release,
            reference=[2000.0, None],
        )
    row0 = r.indices[0][torch.isfinite(r.scores[0])].tolist()
    assert set(row0) == set(range(2, 12)) - {2, 3, 4, 6, 11}
    row1 = r.indices[1][torch.isfinite(r.scores[1])].tolist()
    assert set(row1) == set(range(2, 12))  # nothing excluded: seen allowed, no reference time
    assert r.n_seen.tolist() == [3, 0] and r.n_future.tolist() == [1, 0] and r.n_requested.tolist() == [1, 0]


def test_a_reference_list_is_the_popular_order_less_each_rows_own_exclusions() -> None:
    """Popular.among, read off rank_sparse's masked scores, against a hand computation: the head in its order,
    without the row's seen, future and requested entities; a row that excludes nearly all of the head gets a
    shorter list, padded."""
    order = [7, 3, 11, 2, 9, 5, 13, 4, 8, 10, 6, 12]  # most frequent first; index 14 never held
    popular = Popular.of(order)
    scores = torch.randn(3, 15)
    scores[:, :2] = float("-inf")  # PAD and UNK, as a model scores them
    seen = torch.tensor([[3, 9, PAD], [PAD, PAD, PAD], [7, 3, 11]])
    future = torch.zeros(3, 15, dtype=torch.bool)
    future[0, 13] = future[2, [2, 9, 5, 13]] = True
    requested = torch.tensor([[14], [PAD], [4]])  # 14 is outside the head: nothing to remove
    got = rank_sparse(scores, 3, seen=seen, future=future, requested=requested, floor=popular).floor
    assert got is not None

    def by_hand(row: int) -> list[int]:
        gone = set(seen[row].tolist()) | set(requested[row].tolist()) | set(future[row].nonzero().flatten().tolist())
        kept = [i for i in order if i not in gone][:FLOOR_K]
        return kept + [PAD] * (FLOOR_K - len(kept))

    assert got.tolist() == [by_hand(r) for r in range(3)]
    assert got.tolist()[2] == [8, 10, 6, 12, PAD, PAD, PAD, PAD, PAD, PAD]
    assert rank_sparse(scores, 3, seen=None, future=None, requested=None).floor is None


def test_recommend_adds_each_rows_reference_list_under_the_same_exclusions() -> None:
    torch.manual_seed(0)
    model = SASRec(SASRecConfig(vocab_size=12, max_len=8, d_model=8, n_heads=1, n_layers=1, d_ff=16)).eval()
    release = release_tensor([str(i) for i in range(10)], {"9": 2020.0})  # index 11 released 2020
    popular = Popular.of([11, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    with torch.inference_mode():
        r = recommend(
            model,
            [[2, 3, 4], [5]],
            k=3,
            exclude_seen=[True, False],
            requested=[[6], []],
            release=release,
            reference=[2000.0, None],
            floor=popular,
        )
    assert r.floor is not None
    assert r.floor.tolist() == [[5, 7, 8, 9, 10, PAD, PAD, PAD, PAD, PAD], [11, 2, 3, 4, 5, 6, 7, 8, 9, 10]]


def test_sparse_rank_matches_the_mask_version() -> None:
    """The serving path (index lists) returns exactly what the mask reference returns."""
    from models.ranking import index_rows

    gen = torch.Generator().manual_seed(0)
    for trial in range(24):
        b, v = 6, 40
        scores = torch.randn(b, v, generator=gen)
        scores[:, :2] = float("-inf")  # padding and unknown
        seen_rows = [
            torch.randint(2, v, (int(torch.randint(0, 12, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(b)
        ]  # duplicates included
        seen_rows[0] = []  # a row that keeps its seen items
        req_rows = [torch.randint(2, v, (3,), generator=gen).tolist() if r % 2 else [] for r in range(b)]
        if trial % 3 == 1:  # no row requests anything, or no row excludes its seen items: index_rows gives None
            req_rows = [[] for _ in range(b)]
        elif trial % 3 == 2:
            seen_rows = [[] for _ in range(b)]
        fut = torch.rand(b, v, generator=gen) < 0.2 if trial % 2 else None
        k = int(torch.randint(1, v + 5, (1,), generator=gen))
        dense = rank_by_masks(
            scores, k, seen=index_mask(pad_rows(seen_rows), v), future=fut, requested=index_mask(pad_rows(req_rows), v)
        )
        for sparse in (
            rank_sparse(scores, k, seen=pad_rows(seen_rows), future=fut, requested=pad_rows(req_rows)),
            rank_sparse(scores, k, seen=index_rows(seen_rows), future=fut, requested=index_rows(req_rows)),
        ):
            assert torch.equal(dense.scores, sparse.scores)
            finite = torch.isfinite(dense.scores)
            assert torch.equal(dense.indices[finite], sparse.indices[finite])  # ties among -inf may differ
            for a, c in (
                (dense.n_seen, sparse.n_seen),
                (dense.n_future, sparse.n_future),
                (dense.n_requested, sparse.n_requested),
            ):
                assert torch.equal(a, c)


def test_index_rows_is_none_only_when_every_row_is_empty() -> None:
    from models.ranking import index_rows

    assert index_rows([[], []]) is None
    assert index_rows([]) is None
    rows = index_rows([[], [5, 7]])
    assert rows is not None and rows.tolist() == [[0, 0], [5, 7]]


def test_top_k_of_wide_rows_matches_torch_topk() -> None:
    """Through block maxima: the same values as topk, ties and -inf included, any width and k."""
    g = torch.Generator().manual_seed(0)
    for v in (BLOCKED_FROM, BLOCKED_FROM + 77, 300_001):
        scores = torch.randn(5, v, generator=g)
        scores[0, : v // 2] = float("-inf")  # masked candidates
        scores[1] = torch.randint(0, 20, (v,), generator=g).float()  # ties everywhere
        scores[2, -3:] = 100.0  # the best sit in the last, partial block
        scores[3, : BLOCK * 3] = 50.0  # more than k equal maxima
        scores[4] = float("-inf")
        scores[4, 7] = 1.0  # fewer candidates than k
        for k in (1, 10, 100):
            want_v, _ = scores.topk(k, dim=1)
            got_v, got_i = top_k(scores, k)
            assert torch.equal(got_v, want_v), (v, k)
            assert torch.equal(scores.gather(1, got_i), got_v)  # each index holds its value
            assert all(len(set(row.tolist())) == k for row in got_i)  # no candidate twice
