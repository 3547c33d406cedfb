import itertools
import math

import pytest
import torch

from training.evaluate import evaluate, metrics_from_ranks, target_ranks
from training.splits import leave_one_out, windows


def test_leave_one_out() -> None:
    s = leave_one_out([[2, 3, 4, 5], [6, 7]])
    assert s.train == [[2, 3], [6, 7]]
    assert s.valid.histories == [[2, 3]] and s.valid.targets == [4]
    assert s.test.histories == [[2, 3, 4]] and s.test.targets == [5]
    full = leave_one_out([[2, 3, 4, 5]], full_data=True)
    assert full.train == [[2, 3, 4, 5]] and not full.test.targets


def test_windows_cover_every_transition_once() -> None:
    seq = list(range(2, 12))  # 10 items, 9 transitions
    w = windows([seq], 4)
    assert w == [[8, 9, 10, 11], [5, 6, 7, 8], [2, 3, 4, 5]]
    pairs = [p for r in w for p in itertools.pairwise(r)]
    assert sorted(pairs) == list(itertools.pairwise(seq))
    assert windows([[2]], 4) == []


def test_metrics_hand_computed() -> None:
    m = metrics_from_ranks(torch.tensor([0, 2, 20]))
    assert m["HR@1"] == pytest.approx(1 / 3)
    assert m["HR@5"] == pytest.approx(2 / 3) and m["HR@10"] == pytest.approx(2 / 3)
    assert m["NDCG@5"] == pytest.approx((1 + 1 / math.log2(4)) / 3)
    assert m["MRR"] == pytest.approx((1 + 1 / 3 + 1 / 21) / 3)


def test_ranks_count_ties_against_the_target() -> None:
    scores = torch.tensor([[0.0, 0.0, 1.0, 3.0, 1.0, 2.0]])
    cand = torch.tensor([[False, False, True, True, True, True]])
    assert target_ranks(scores, torch.tensor([2]), cand).tolist() == [3]  # 3.0, 2.0 and the tie 1.0


def test_sampled_negatives_avoid_interacted_items() -> None:
    from models.ids import IdMap  # noqa: F401  (vocab conventions: 0 pad, 1 unk)
    from training.splits import EvalSet

    vocab = 2 + 200
    # A scorer that ranks item 2 first and items the user touched (3..101) next: with negatives
    # drawn only among untouched items, the target (item 2) always ranks first.
    def score(seq: torch.Tensor) -> torch.Tensor:
        s = torch.zeros(seq.size(0), vocab)
        s[:, 2] = 10.0
        s[:, 3:102] = 5.0
        return s

    data = EvalSet([0], [[3, 4]], [2], [list(range(2, 102))])
    pop = torch.ones(vocab)
    for proto in ("uniform", "popularity"):
        m = evaluate(score, data, vocab, 10, proto, n_negatives=100, popularity=pop)
        assert m["HR@1"] == 1.0
    m = evaluate(score, data, vocab, 10, "full", exclude_seen=False)
    assert m["HR@1"] == 1.0
    with pytest.raises(ValueError, match="fewer than 101"):  # only 100 untouched items
        evaluate(score, data, vocab, 10, "uniform", n_negatives=101, popularity=pop)
