import itertools
import math

import pytest
import torch

from tests.training.reference_eval import draw_negatives, target_ranks
from tests.training.reference_eval import evaluate as reference_evaluate
from training.jobs.recommend_eval import Protocol, evaluate, metrics_from_ranks
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
    from training.splits import EvalSet

    scores = torch.tensor([[float("-inf"), float("-inf"), 1.0, 3.0, 1.0, 2.0]])
    cand = torch.tensor([[False, False, True, True, True, True]])
    assert target_ranks(scores, torch.tensor([2]), cand).tolist() == [3]  # the reference: 3.0, 2.0 and the tie 1.0
    data = EvalSet([0], [[]], [2], [[2]])
    got = evaluate(lambda seq: scores.expand(len(seq), -1), data, vocab_size=6, max_history=4, protocol=Protocol())
    assert got["MRR"] == 0.25  # rank 3, as the reference


def test_sampled_negatives_avoid_interacted_items() -> None:
    from training.splits import EvalSet

    vocab = 2 + 200

    # Items the user touched (3..101) outscore the target (item 2); the 100 untouched items (102..201)
    # score below it. Only when negatives and full-ranking candidates leave the touched items out
    # does the target rank first; one touched item drawn as a negative would push it to rank 2.
    def score(seq: torch.Tensor) -> torch.Tensor:
        s = torch.zeros(seq.size(0), vocab)
        s[:, 2] = 5.0
        s[:, 3:102] = 10.0
        return s

    touched = list(range(3, 102))
    data = EvalSet([0], [touched], [2], [[2, *touched]])
    pop = torch.ones(vocab)
    pop[3:102] = 1000.0  # popularity sampling would favour the touched items if it could draw them
    for proto in ("uniform", "popularity"):
        m = evaluate(score, data, vocab_size=vocab, max_history=200, protocol=Protocol(proto, 100), popularity=pop)
        assert m["HR@1"] == 1.0, proto
    m = evaluate(score, data, vocab_size=vocab, max_history=200, protocol=Protocol("full", exclude_seen=True))
    assert m["HR@1"] == 1.0
    m = evaluate(score, data, vocab_size=vocab, max_history=200, protocol=Protocol("full", exclude_seen=False))
    assert m["MRR"] == 1 / 100  # 99 touched items rank above it
    with pytest.raises(ValueError, match="fewer than 101"):  # only 100 untouched items
        evaluate(score, data, vocab_size=vocab, max_history=200, protocol=Protocol("uniform", 101), popularity=pop)


def test_negatives_drawn_batch_by_batch_are_the_whole_sets_draw() -> None:
    from training.splits import EvalSet

    vocab, gen = 2 + 300, torch.Generator().manual_seed(0)
    users = 70  # more than one evaluation batch of 32
    hist = [torch.randint(2, vocab, (8,), generator=gen).tolist() for _ in range(users)]
    data = EvalSet(list(range(users)), hist, [h[-1] % 297 + 3 for h in hist], [[*h, h[-1] % 297 + 3] for h in hist])
    pop = torch.rand(vocab, generator=gen) * 100
    weights = torch.randn(vocab, generator=gen)

    def score(seq: torch.Tensor) -> torch.Tensor:
        return weights.expand(seq.size(0), -1) + seq[:, :1].float()  # scores differ by row

    for name in ("uniform", "popularity"):
        proto = Protocol(name, 50, batch_size=32)
        drawn = draw_negatives(data, vocab_size=vocab, protocol=proto, popularity=pop)
        assert [d.shape for d in drawn] == [(32, 50), (32, 50), (6, 50)]
        for row, negs in zip(hist, torch.cat(drawn), strict=True):  # never an item the user touched
            assert not set(negs.tolist()) & set(row)
        kw = {"vocab_size": vocab, "max_history": 8, "protocol": proto, "popularity": pop}
        assert reference_evaluate(score, data, negatives=drawn, **kw) == evaluate(score, data, **kw)  # type: ignore[arg-type]
        other = draw_negatives(
            data, vocab_size=vocab, protocol=Protocol(name, 50, batch_size=32, seed=1), popularity=pop
        )
        assert reference_evaluate(score, data, negatives=other, **kw) != evaluate(score, data, **kw)  # type: ignore[arg-type]


def test_a_training_run_draws_each_protocols_negatives_once(synthetic_dir, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import training.jobs.recommend_eval as ev
    from tests.conftest import TINY_REC, run_job

    calls: list[int] = []
    real = ev._draw_by_masking

    def counting(interacted, *args):  # type: ignore[no-untyped-def]
        calls.append(len(interacted))
        return real(interacted, *args)

    monkeypatch.setattr(ev, "_draw_by_masking", counting)
    run_job(["model.kind='sasrec'", "name='once'", *TINY_REC, "eval.protocol='popularity'"], tmp_path, synthetic_dir)
    # 40 users, one batch. Before training, the 3 baselines on validation users draw once, the
    # model's cost is timed once and the test's (every scorer) once per sampled protocol; each of the
    # 3 epochs' validations draws once; after training, validation (every prior weight) and test (the
    # model and 3 baselines) once per sampled protocol.
    assert calls == [40] * (1 + 1 + 2 + 3 + 2 + 2)


def test_negatives_by_rejection_follow_the_masking_draw() -> None:
    """The large-catalog draw: n distinct items per user, none it touched, with the same inclusion
    probabilities as the exact draw (successive sampling by weight without replacement)."""
    import torch

    from training.jobs.recommend_eval import _draw_by_masking, _draw_by_rejection

    weights = torch.tensor([0.0, 0.0] + [float(1 + i % 5) for i in range(20)], dtype=torch.float64)
    interacted = [[2, 3, 9], [], [21, 20, 4, 5, 6, 7, 8]] * 2000
    gen = torch.Generator().manual_seed(0)
    a = _draw_by_rejection(interacted, weights, 5, gen)
    b = _draw_by_masking(interacted, weights, 5, gen)
    assert a.shape == b.shape == (6000, 5)
    for row, touched in zip(a.tolist(), interacted, strict=True):
        assert len(set(row)) == 5 and not set(row) & set(touched) and min(row) >= 2
    for user in range(3):  # inclusion frequency of every item, per kind of user
        fa = torch.bincount(a[user::3].flatten(), minlength=22).double() / 2000
        fb = torch.bincount(b[user::3].flatten(), minlength=22).double() / 2000
        assert (fa - fb).abs().max() < 0.05, (user, fa, fb)
    with pytest.raises(ValueError, match="too few items"):
        _draw_by_rejection([list(range(2, 19))], weights, 5, gen)


def test_a_large_catalog_is_scored_in_smaller_batches_with_the_same_results(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from training.jobs import recommend_eval as ev
    from training.splits import EvalSet

    g = torch.Generator().manual_seed(0)
    table = torch.randn(30, 30, generator=g)
    data = EvalSet(
        users=list(range(50)),
        histories=[[2 + u % 20, 3 + u % 25] for u in range(50)],
        targets=[4 + u % 26 for u in range(50)],
        interacted=[[2 + u % 20, 3 + u % 25, 4 + u % 26] for u in range(50)],
    )

    def scores(seq: torch.Tensor) -> torch.Tensor:
        return table[seq[:, 0]]

    protocols = [ev.Protocol(batch_size=64), ev.Protocol(batch_size=64, negatives="uniform", n_negatives=5)]
    whole = [ev.evaluate(scores, data, vocab_size=30, max_history=4, protocol=p) for p in protocols]
    monkeypatch.setattr(ev, "EVAL_CELLS", 30 * 7)  # 7 users a batch
    assert ev.rows_per_batch(protocols[0], 30) == 7
    assert [ev.evaluate(scores, data, vocab_size=30, max_history=4, protocol=p) for p in protocols] == whole


def test_evaluate_all_gives_each_scorers_figures_on_the_same_users_and_stops_at_its_deadline() -> None:
    from training.jobs.recommend_eval import BASELINES, SparseScorer, evaluate_all
    from training.splits import EvalSet

    vocab, gen = 2 + 300, torch.Generator().manual_seed(0)
    users = 70
    hist = [
        torch.randint(2, vocab, (int(torch.randint(1, 12, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(users)
    ]
    hist[0] = [5, 5, 7, 5]  # repeats, and the target among the earlier items
    targets = [h[-1] % 297 + 3 for h in hist]
    targets[0] = 7
    data = EvalSet(list(range(users)), hist, targets, [[*h, t] for h, t in zip(hist, targets, strict=True)])
    pop = torch.rand(vocab, generator=gen) * 100
    tied = torch.randint(0, 4, (vocab,), generator=gen).float()  # many ties with the target

    def smooth(seq: torch.Tensor) -> torch.Tensor:
        s = torch.linspace(0, 1, vocab).expand(seq.size(0), -1) + seq[:, :1].float()
        s[:, :2] = float("-inf")
        return s

    def ties(seq: torch.Tensor) -> torch.Tensor:
        s = tied.expand(seq.size(0), -1).clone()
        s[:, :2] = float("-inf")
        return s

    def stacked(seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # +1 per history position onto a tied base: repeated items sum, many ties with the target.
        rows = torch.arange(len(seq)).repeat_interleave(seq.size(1))
        return rows, seq.flatten(), (seq != 0).flatten().float()

    protocols = [Protocol("full", batch_size=32), Protocol("full", exclude_seen=False, batch_size=32)]
    protocols += [Protocol(n, 50, batch_size=32) for n in ("uniform", "popularity")]
    # Baselines are ranked from their sparse form (SparseScores), the reference from their dense scores.
    scorers = {"smooth": smooth, "ties": ties, "sparse_ties": SparseScorer(tied, stacked)}
    scorers |= {name: fit(hist, vocab) for name, fit in BASELINES.items()}
    got = evaluate_all(scorers, data, protocols=protocols, vocab_size=vocab, max_history=8, popularity=pop)
    assert got.users == got.of == users
    for name, fn in scorers.items():
        for p in protocols[1:]:  # one "full" entry per protocol name: the last given wins
            want = reference_evaluate(fn, data, vocab_size=vocab, max_history=8, protocol=p, popularity=pop)
            assert got.metrics[name][p.negatives] == pytest.approx(want), (name, p)
    seen_removed = evaluate_all(scorers, data, protocols=protocols[:1], vocab_size=vocab, max_history=8)
    for name, fn in scorers.items():
        want = reference_evaluate(fn, data, vocab_size=vocab, max_history=8, protocol=protocols[0])
        assert seen_removed.metrics[name]["full"] == pytest.approx(want), name
    early = evaluate_all(
        scorers, data, protocols=protocols, vocab_size=vocab, max_history=8, popularity=pop, deadline=0.0
    )
    assert early.users == 32 and all(m["n"] == 32 for s in early.metrics.values() for m in s.values())
