import itertools

import pytest
import torch

from models.base import SequentialRecommender
from models.bert4rec import BERT4Rec, BERT4RecConfig
from models.checkpoint import load_checkpoint, save_checkpoint
from models.sasrec import SASRec, SASRecConfig
from models.transitions import merge_counts, pair_counts, top_successors

V = 10
SEQUENCES = [[2, 3, 4, 3, 4], [3, 4], [], [5], [2, 5, 2, 3], [6, 3, 7]]


def transition_table(sequences: list[list[int]], vocab_size: int, *, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The table a model's `set_transitions` fills from `sequences`."""
    return top_successors(*pair_counts(sequences, vocab_size), vocab_size, width=width)


def test_table_keeps_the_most_frequent_next_items_with_log_counts() -> None:
    succ, logc = transition_table(SEQUENCES, V, width=2)
    assert succ.shape == logc.shape == (V, 2) and succ.dtype == torch.int32
    # 3 -> 4 three times, 3 -> 7 once; 2 -> 3 twice, 2 -> 5 once; nothing crosses sequences (4 -> 3 of
    # the second sequence, 5 -> 2 of the fourth and fifth).
    assert succ[3].tolist() == [4, 7] and torch.allclose(logc[3], torch.log1p(torch.tensor([3.0, 1.0])))
    assert succ[2].tolist() == [3, 5] and torch.allclose(logc[2], torch.log1p(torch.tensor([2.0, 1.0])))
    assert succ[4].tolist() == [3, 0] and logc[4, 1] == 0  # PAD and 0 where an item has fewer
    assert succ[5].tolist() == [2, 0] and succ[7].tolist() == [0, 0] and (logc[7] == 0).all()


def test_table_width_ties_and_input_order() -> None:
    succ, _ = transition_table([[2, 9], [2, 5], [2, 7], [2, 5]], V, width=2)
    assert succ[2].tolist() == [5, 7]  # 5 twice first, then 7 before 9: a tie goes to the smaller index
    again, _ = transition_table([[2, 5], [2, 7], [2, 5], [2, 9]], V, width=2)
    assert torch.equal(succ, again)
    empty, logc = transition_table([[], [4]], V, width=3)
    assert (empty == 0).all() and (logc == 0).all()


def test_counts_of_parts_of_a_log_add_up_to_the_whole_table() -> None:
    """Ranks holding different users count their pairs apart; merged, the table is the whole log's."""
    parts = [pair_counts(SEQUENCES[:2], V), pair_counts(SEQUENCES[2:5], V), pair_counts(SEQUENCES[5:], V)]
    keys, counts = merge_counts(torch.cat([k for k, _ in parts]), torch.cat([c for _, c in parts]))
    whole_keys, whole_counts = pair_counts(SEQUENCES, V)
    assert torch.equal(keys, whole_keys) and torch.equal(counts, whole_counts)
    assert int(counts[keys.tolist().index(3 * V + 4)]) == 3  # 3 -> 4 in the first two sequences
    for got, want in zip(
        top_successors(keys, counts, V, width=2), transition_table(SEQUENCES, V, width=2), strict=True
    ):
        assert torch.equal(got, want)
    model = SASRec(SASRecConfig(vocab_size=V, max_len=8, d_model=8, n_heads=2, n_layers=1, transition_width=2))
    model.set_transition_counts(keys, counts)
    assert torch.equal(model.successors, transition_table(SEQUENCES, V, width=2)[0])


def _dense_prior(last: list[int]) -> torch.Tensor:
    """log1p(count(last -> j)) for every j, counted by hand from SEQUENCES. -> (B, V)"""
    prior = torch.zeros(len(last), V)
    for row, item in enumerate(last):
        for s in SEQUENCES:
            for a, b in itertools.pairwise(s):
                prior[row, b] += a == item
    return torch.log1p(prior)


KINDS = {"sasrec": (SASRecConfig, SASRec), "bert4rec": (BERT4RecConfig, BERT4Rec)}


def _model(weight: float, width: int = 3, kind: str = "sasrec") -> SequentialRecommender:
    torch.manual_seed(0)
    config_cls, model_cls = KINDS[kind]
    cfg = config_cls(vocab_size=V, max_len=6, d_model=8, n_heads=1, n_layers=1, d_ff=16, transition_width=width)
    m = model_cls(cfg).eval()
    m.set_transitions(SEQUENCES)
    m.config.transition_weight = weight
    return m


@pytest.mark.parametrize("kind", KINDS)
def test_scores_add_the_weighted_prior_of_the_last_item(kind: str) -> None:
    seq = torch.tensor([[5, 2, 0, 0], [6, 3, 0, 0], [0, 0, 0, 0]])
    with torch.no_grad():
        plain, with_prior = _model(0.0, kind=kind).scores(seq), _model(1.5, kind=kind).scores(seq)
    bonus = 1.5 * _dense_prior([2, 3, 0])  # row 3: an empty history gets nothing
    assert torch.isinf(with_prior[:, :2]).all()
    assert torch.allclose(with_prior[:, 2:], plain[:, 2:] + bonus[:, 2:], atol=1e-5)
    assert not torch.allclose(with_prior, plain)
    form, bare = _model(1.5, kind=kind).dot_form(), _model(0.0, kind=kind).dot_form()
    assert form is not None and bare is not None and form.additions is not None and bare.additions is None


@pytest.mark.parametrize("kind", KINDS)
def test_the_table_and_weight_survive_a_checkpoint(kind: str, tmp_path: pytest.TempPathFactory) -> None:
    m = _model(2.0, kind=kind)
    path = tmp_path / "model.pt"  # type: ignore[operator]
    save_checkpoint(path, kind, m)
    _, back = load_checkpoint(path)
    assert isinstance(back, KINDS[kind][1]) and back.config.transition_weight == 2.0
    back.eval()
    seq = torch.tensor([[5, 2, 0]])
    with torch.no_grad():
        assert torch.allclose(back.scores(seq), m.scores(seq))


@pytest.mark.parametrize("kind", KINDS)
def test_without_a_table_the_state_has_no_new_keys(kind: str) -> None:
    """Checkpoints written before the prior existed load into a model without one."""
    keys = set(_model(0.0, width=0, kind=kind).state_dict())
    assert not {k for k in keys if "successor" in k}
    assert {"successors", "successor_log_counts"} <= set(_model(0.0, kind=kind).state_dict())


def test_negative_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="transition"):
        SASRecConfig(vocab_size=V, transition_width=-1)
    with pytest.raises(ValueError, match="transition"):
        BERT4RecConfig(vocab_size=V, transition_weight=-1.0)


def test_transition_pairs_stay_within_each_sequence() -> None:
    from models.transitions import transition_pairs

    sequences = [[5, 6, 7], [], [8], [9, 9], [3, 4]]
    first, second = transition_pairs(sequences)
    assert list(zip(first.tolist(), second.tolist(), strict=True)) == [(5, 6), (6, 7), (9, 9), (3, 4)]
    assert [len(t) for t in transition_pairs([])] == [0, 0]
    assert [len(t) for t in transition_pairs([[], [2]])] == [0, 0]
