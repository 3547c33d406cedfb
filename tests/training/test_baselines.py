"""The simple baselines every recommendation run prints beside the model."""

import numpy as np
import pytest
import torch

from models.ids import N_SPECIAL
from models.ranking import pack_histories
from training.jobs.recommend_eval import item_knn_scorer, popularity_scorer, transitions_scorer

V = 10  # items 2..9

KNOWN = [
    [2, 3, 4],
    [2, 3, 5],
    [6, 2, 5],
    [7, 8],
    [7, 8],
    [9, 9, 9, 9],  # the most frequent item, never next to 2
]


def ranking(scores: torch.Tensor) -> list[int]:
    return torch.argsort(scores, descending=True, stable=True).tolist()


def test_popularity_orders_by_count_and_hides_specials() -> None:
    s = popularity_scorer(KNOWN, V)(pack_histories([[2]], 5))[0]
    assert ranking(s)[0] == 9 and bool(torch.isinf(s[:N_SPECIAL]).all())


def test_transitions_follow_the_last_item_then_popularity() -> None:
    score = transitions_scorer(KNOWN, V)
    s = score(pack_histories([[7, 2]], 5))[0]  # last item 2: followed by 3 twice, 5 once
    assert ranking(s)[:3] == [3, 5, 9]  # then popularity fills: 9 is the most frequent
    assert bool(torch.isinf(s[:N_SPECIAL]).all())
    # Only the last item counts, wherever the padding is.
    assert ranking(score(pack_histories([[4, 7]], 8))[0])[0] == 8
    padded = score(pack_histories([[9, 2], [2]], 6))
    assert torch.equal(padded[0], padded[1])


def test_item_knn_sums_similarities_over_the_history() -> None:
    score = item_knn_scorer(KNOWN, V)
    s = score(pack_histories([[7]], 5))[0]
    assert ranking(s)[0] == 8  # always together
    assert s[7] < s[8]  # an item is not its own neighbour
    both = score(pack_histories([[3, 4]], 5))[0]  # 2 co-occurs with both, 5 with 3 only
    assert ranking(both)[0] == 2 and both[2] > both[5] > both[6]
    few = item_knn_scorer(KNOWN, V, neighbours=1)(pack_histories([[2]], 5))[0]
    assert int((few > 0.01).sum()) == 1  # one neighbour kept; the rest is the popularity fill


@pytest.mark.parametrize("block_pairs", [7, 100, 10**9])
def test_item_knn_built_in_blocks_matches_the_dense_definition(
    block_pairs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cosine over users, self excluded, top `neighbours` per item with ties to the lower id: the same
    neighbours however the items are split into blocks."""
    from training.jobs import recommend_eval as ev

    monkeypatch.setattr(ev, "KNN_BLOCK_PAIRS", block_pairs)
    gen = torch.Generator().manual_seed(0)
    vocab = 40
    known = [
        torch.randint(3, vocab, (int(torch.randint(1, 12, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(60)
    ]
    ui = torch.zeros(len(known), vocab)
    for u, seq in enumerate(known):
        ui[u, seq] = 1.0
    co = ui.t() @ ui
    n = ui.sum(0)
    sim = co / torch.sqrt(n[:, None] * n[None, :]).clamp(min=1.0)
    want = set()
    for a in range(vocab):
        cands = sorted((-float(sim[a, b]), b) for b in range(vocab) if b != a and co[a, b] > 0)[:3]
        want |= {(a, b, round(-s, 5)) for s, b in cands}
    nbr, nsim = ev._knn_neighbours(known, vocab, 3)
    got = [(a, int(b), round(float(z), 5)) for a in range(vocab) for b, z in zip(nbr[a], nsim[a], strict=True) if z > 0]
    assert len(got) == len(set(got)) and set(got) == want
    assert all(torch.equal(row[row != 0], row[row != 0].sort().values) for row in nbr)  # by id: the sum's order


def test_a_baseline_too_slow_for_its_seconds_is_fitted_on_a_seeded_sample_of_users() -> None:
    from training.jobs.recommend_eval import FIT_SECONDS, fit_baseline, item_knn_scorer

    gen = torch.Generator().manual_seed(0)
    known = [
        torch.randint(2, 40, (int(n),), generator=gen).tolist() for n in torch.randint(1, 30, (300,), generator=gen)
    ]
    seq = torch.tensor([[5, 6, 7], [9, 0, 0]])
    everyone, n = fit_baseline("item_knn", known, 40)
    assert n == 300 and torch.equal(everyone(seq), item_knn_scorer(known, 40)(seq))
    lengths = np.array([len(k) for k in known])
    half = float(FIT_SECONDS["item_knn"](lengths).sum()) / 2
    sampled, n = fit_baseline("item_knn", known, 40, seconds=half, seed=3)
    again, n_again = fit_baseline("item_knn", known, 40, seconds=half, seed=3)
    assert 0 < n < 300 and n == n_again and torch.equal(sampled(seq), again(seq))  # seeded
    assert not torch.equal(sampled(seq), everyone(seq))
    for name in ("popularity", "transitions"):  # they cost about what reading the log does: everyone
        assert fit_baseline(name, known, 40, seconds=0.0)[1] == 300
