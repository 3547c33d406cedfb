import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn

from models.bert4rec import BERT4Rec, BERT4RecConfig
from models.ids import N_SPECIAL
from models.mhsa import MHSA, MHSAConfig
from models.ranking import pack_histories
from models.sasrec import SASRec, SASRecConfig
from models.social import SocialConfig, SocialModel, pack_steps
from models.staypoints import collate_staypoints
from models.traced import NotTraceable, TracedScores, example_rows, serving_scores

VOCAB, MAX_LEN = 40, 12


def _rows(batch: int, longest: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(N_SPECIAL, VOCAB) for _ in range(rng.randint(1, longest))] for _ in range(batch)]


def _rec(model: SASRec | BERT4Rec) -> Callable[[list[list[int]]], torch.Tensor]:
    return lambda rows: pack_histories(rows, model.max_history)


def _social(cfg: SocialConfig) -> Callable[[list[list[int]]], Any]:
    def build(rows: list[list[int]]) -> Any:
        steps = [
            [
                (x % cfg.n_users, N_SPECIAL + x % (cfg.n_actions - N_SPECIAL), 1e6 - 977.0 * (len(r) - i))
                for i, x in enumerate(r)
            ]
            for r in rows
        ]
        return pack_steps(
            steps, query_times=[1e6] * len(rows), max_history=cfg.max_history, n_buckets=cfg.n_time_buckets
        )

    return build


def _stays(cfg: MHSAConfig) -> Callable[[list[list[int]]], Any]:
    def build(rows: list[list[int]]) -> Any:
        return collate_staypoints(
            [[(x % cfg.n_locations, 61 * i % 1440, i % 7, 29 * i) for i, x in enumerate(r)] for r in rows],
            [n % cfg.n_users for n in range(len(rows))],
            max_len=cfg.max_len,
        )

    return build


def _cases() -> list[tuple[str, nn.Module, Callable[[list[list[int]]], Any]]]:
    torch.manual_seed(0)
    rec = dict(vocab_size=VOCAB, max_len=MAX_LEN, d_model=16, n_heads=2, n_layers=2, d_ff=32)
    cases: list[tuple[str, nn.Module, Callable[[list[list[int]]], Any]]] = []
    for name, m in (("sasrec", SASRec(SASRecConfig(**rec))), ("bert4rec", BERT4Rec(BERT4RecConfig(**rec)))):
        cases.append((name, m.eval(), _rec(m)))
    for kind, mix in (("bsa", 0.7), ("learned", 1.0), ("tv", 0.5)):
        f = dict(rec, filter_kind=kind, filter_mix=mix)
        for name, m in (("sasrec", SASRec(SASRecConfig(**f))), ("bert4rec", BERT4Rec(BERT4RecConfig(**f)))):
            cases.append((f"{name}-{kind}", m.eval(), _rec(m)))
    for positions in ("none", "learned", "rope", "time"):
        for pooling, copy in (("mean", True), ("last", False)):
            cfg = SocialConfig(
                n_users=VOCAB,
                n_actions=5,
                emb_dim=8,
                n_heads=2,
                n_layers=2,
                d_ff=16,
                max_history=MAX_LEN,
                positions=positions,
                pooling=pooling,
                copy_head=copy,
            )
            cases.append((f"social-{positions}-{pooling}", SocialModel(cfg).eval(), _social(cfg)))
    for pointer in (False, True):
        mcfg = MHSAConfig(
            n_locations=VOCAB, n_users=5, d_model=16, n_heads=2, d_ff=32, n_layers=2, pointer=pointer, max_len=MAX_LEN
        )
        cases.append((f"mhsa-pointer-{pointer}", MHSA(mcfg).eval(), _stays(mcfg)))
    return cases


CASES = _cases()


@pytest.mark.parametrize(("name", "model", "build"), CASES, ids=[c[0] for c in CASES])
def test_every_model_kind_traces_and_scores_like_eager_on_unseen_shapes(
    name: str, model: nn.Module, build: Callable[[list[list[int]]], Any]
) -> None:
    examples = [build(rows) for rows in example_rows(N_SPECIAL, VOCAB, max_len=MAX_LEN)]
    scores, how = serving_scores(model, lambda: examples, enabled=True)
    assert how == "traced", how  # a kind that falls back would serve at eager speed, silently
    # Batch sizes, lengths and padding the trace never saw, and the longest window.
    for batch, longest, seed in ((2, 1, 1), (5, MAX_LEN, 2), (17, 4, 3), (64, MAX_LEN, 4)):
        b = build(_rows(batch, longest, seed))
        with torch.inference_mode():
            want, got = model.scores(b), scores(b)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


class Branchy(nn.Module):
    """scores() that branches on the values: any trace of it fixes the branch the examples took."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.training = False

    def scores(self, seq: torch.Tensor) -> torch.Tensor:
        if seq.max() > 20:
            return seq.float() * self.w * 2
        return seq.float() * self.w


def test_a_value_dependent_model_is_served_eagerly_and_says_why() -> None:
    model = Branchy()
    examples = [torch.randint(2, 10, (8, 5)), torch.randint(2, 10, (1, 3))]  # the examples agree either way
    scores, how = serving_scores(model, lambda: examples, enabled=True)
    assert how.startswith("eager (value-dependent step") and "test_traced.py" in how
    big = torch.full((2, 3), 30)
    assert torch.equal(scores(big), model.scores(big))


def test_traced_scores_that_differ_from_eager_are_refused() -> None:
    class Drifting(Branchy):
        calls = 0

        def scores(self, seq: torch.Tensor) -> torch.Tensor:
            self.calls += 1  # the eager reference call after tracing sees another constant
            return seq.float() * self.w * self.calls

    with pytest.raises(NotTraceable, match="differ from eager ones on example batch 0"):
        TracedScores(Drifting(), [torch.randint(2, 10, (4, 5))])


def test_a_batch_with_other_fields_than_the_examples_runs_eagerly() -> None:
    torch.manual_seed(0)
    cfg = MHSAConfig(n_locations=VOCAB, n_users=5, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=MAX_LEN)
    model, build = MHSA(cfg).eval(), _stays(cfg)
    traced = TracedScores(model, [build(rows) for rows in example_rows(N_SPECIAL, VOCAB, max_len=MAX_LEN)])
    b = build(_rows(3, 6, 0))
    with_target = replace(b, target=torch.tensor([2, 3, 4]))  # a field the trace does not take
    with torch.inference_mode():
        torch.testing.assert_close(traced(with_target), model.scores(with_target))


def test_tracing_off_or_a_training_model_stays_eager() -> None:
    model = SASRec(SASRecConfig(vocab_size=VOCAB, max_len=MAX_LEN, d_model=16, n_heads=2, n_layers=1, d_ff=32))
    examples = [pack_histories(_rows(4, 5, 0), MAX_LEN)]
    assert serving_scores(model.eval(), lambda: examples, enabled=False)[1] == "eager (tracing off)"
    assert serving_scores(model.train(), lambda: examples, enabled=True)[1] == "eager (the model is in training mode)"
