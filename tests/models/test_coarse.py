from pathlib import Path

import pytest
import torch

from models import coarse
from models.artifact import latest_versions
from models.base import SequentialRecommender
from models.bert4rec import BERT4Rec, BERT4RecConfig
from models.coarse import CoarseRanker, wide_ranker
from models.engine import EngineOptions
from models.ids import N_SPECIAL
from models.ranking import Popular, Ranked, pack_histories, recommend
from models.sasrec import SASRec, SASRecConfig
from models.tasks import TASKS
from models.tasks.recommend import RecQuery, load_artifact
from tests.conftest import stored_users

V = 3000


def _sasrec() -> SequentialRecommender:
    torch.manual_seed(0)
    return SASRec(SASRecConfig(vocab_size=V, max_len=12, d_model=16, n_heads=2, n_layers=1, d_ff=32)).eval()


def _sasrec_prior() -> SequentialRecommender:
    """A SASRec with a transition prior heavy enough to reorder its top 10."""
    torch.manual_seed(0)
    cfg = SASRecConfig(vocab_size=V, max_len=12, d_model=16, n_heads=2, n_layers=1, d_ff=32, transition_width=30)
    m = SASRec(cfg).eval()
    g = torch.Generator().manual_seed(1)
    m.set_transitions([torch.randint(N_SPECIAL, V, (400,), generator=g).tolist() for _ in range(60)])
    m.config.transition_weight = 0.5
    return m


def _bert4rec() -> SequentialRecommender:
    torch.manual_seed(0)
    m = BERT4Rec(BERT4RecConfig(vocab_size=V, max_len=12, d_model=16, n_heads=2, n_layers=1, d_ff=32)).eval()
    with torch.no_grad():
        m.out_bias.normal_(0, 1.0)  # a bias that matters to the ranking
    return m


def _batch(seed: int, rows: int = 12) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 11, (rows,), generator=g).tolist()
    histories = [torch.randint(N_SPECIAL, V, (n,), generator=g).tolist() for n in lengths]
    return {
        "histories": histories,
        "exclude_seen": [bool(i % 3) for i in range(rows)],
        "requested": [torch.randint(N_SPECIAL, V, (i % 4,), generator=g).tolist() for i in range(rows)],
        "release": torch.cat([torch.full((N_SPECIAL,), float("-inf")), torch.rand(V - N_SPECIAL, generator=g)]),
        "reference": [None if i % 2 else 0.5 for i in range(rows)],
    }


def _scores(model: SequentialRecommender, batch: dict[str, object]) -> torch.Tensor:
    with torch.inference_mode():
        return model.scores(pack_histories(batch["histories"], model.max_history))


def _same(want: Ranked, got: Ranked, scores: torch.Tensor) -> None:
    """The same ranking up to ties: equal values, each returned index holding its value, and the same
    indices but where scores closer than float32 rounding swap. scores: the model's (B, V)."""
    live = torch.isfinite(want.scores)  # past the live candidates, -inf ties come in any order
    assert torch.allclose(got.scores, want.scores, atol=1e-5)
    assert torch.allclose(scores.gather(1, got.indices)[live], got.scores[live], atol=1e-5)
    assert (got.indices[live] != want.indices[live]).float().mean() < 0.01
    for name in ("n_seen", "n_future", "n_requested"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert (got.floor is None) == (want.floor is None)
    if got.floor is not None and want.floor is not None:  # the same reference lists: the same exclusions
        assert torch.equal(got.floor, want.floor)


@pytest.mark.parametrize("build", [_sasrec, _sasrec_prior, _bert4rec], ids=["sasrec", "sasrec-prior", "bert4rec"])
@pytest.mark.parametrize("k", [1, 10, 300, V])  # V: fewer live candidates than k
def test_coarse_ranking_returns_the_float32_top_k_with_exclusions(build, k: int) -> None:
    model = build()
    ranker = CoarseRanker(model, model.query)
    floor = Popular.of(list(range(V - 1, N_SPECIAL - 1, -1)))  # every item, the last first
    with torch.inference_mode():
        for seed in range(3):
            batch = _batch(seed)
            want = recommend(model, k=k, floor=floor, **batch)
            got = recommend(model, k=k, rank=ranker, floor=floor, **batch)
            _same(want, got, _scores(model, batch))
            assert got.floor is not None and int((got.floor != 0).sum()) > 0


@pytest.mark.parametrize("build", [_sasrec, _sasrec_prior], ids=["sasrec", "sasrec-prior"])
def test_rows_the_certificate_does_not_cover_are_ranked_again_from_float32_scores(build) -> None:
    model = build()
    with torch.no_grad():  # items whose scores differ by less than bfloat16 resolves
        w = model.encoder.token_emb.weight
        w.copy_(w[N_SPECIAL] + 1e-4 * torch.randn_like(w))
    ranker = CoarseRanker(model, model.query, candidates=10)
    batch = _batch(0)
    with torch.inference_mode():
        want = recommend(model, k=10, **batch)
        got = recommend(model, k=10, rank=ranker, **batch)
    assert ranker.fallbacks > 0
    _same(want, got, _scores(model, batch))


def test_a_clear_winner_is_certified_without_the_float32_pass() -> None:
    model = _sasrec()
    ranker = CoarseRanker(model, model.query)
    with torch.inference_mode():
        recommend(model, k=10, rank=ranker, **_batch(1))
    assert ranker.fallbacks == 0


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
@pytest.mark.parametrize("dim", [16, 64, 256])
def test_coarse_scores_stay_within_the_bound(scale: float, dim: int) -> None:
    """What the certificate rests on: this torch's bfloat16 products accumulate in float32."""
    torch.manual_seed(dim)
    model = SASRec(SASRecConfig(vocab_size=V, max_len=4, d_model=dim, n_heads=2, n_layers=1, d_ff=32)).eval()
    with torch.no_grad():
        model.encoder.token_emb.weight.mul_(scale).add_(scale * 0.5)  # same-signed terms: the worst case
    ranker = CoarseRanker(model, model.query)
    q = scale * (torch.rand(64, dim) + 0.5)
    exact, coarse = ranker.exact_scores(q), ranker.coarse_scores(q).float()
    err = (coarse - exact)[:, N_SPECIAL:].abs()
    assert (err <= ranker.bound(q)[:, None]).all()
    assert err.max() > 0  # the coarse scores are coarse: the bound is not vacuous here


def test_wide_ranker_keeps_the_coarse_path_only_where_it_is_faster() -> None:
    model = _sasrec()
    example = pack_histories([[5, 6, 7]] * 8, model.max_history)
    ranker, why = wide_ranker(model, model.query, example, min_speedup=0.0)
    assert isinstance(ranker, CoarseRanker) and "certified exact" in why
    ranker, why = wide_ranker(model, model.query, example, min_speedup=1e9)
    assert ranker is None and "at load" in why


def test_a_model_without_a_dot_form_is_ranked_from_its_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _sasrec()
    monkeypatch.setattr(model, "dot_form", lambda: None)
    example = pack_histories([[5, 6, 7]], model.max_history)
    assert wide_ranker(model, model.query, example, min_speedup=0.0) == (None, "float32 scores")
    with pytest.raises(ValueError, match="no dot form"):
        CoarseRanker(model, model.query)


@pytest.mark.parametrize("name", ["sasrec-tiny", "bert4rec-tiny"])
def test_an_engine_ranking_coarsely_answers_what_the_float32_engine_answers(
    tiny_artifacts: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coarse, "MIN_SPEEDUP", 0.0)  # a tiny catalog: keep the coarse path however fast
    folder = latest_versions(tiny_artifacts)[name]
    plain = TASKS["recommend"].open(folder, EngineOptions(coarse_from=None))
    wide = TASKS["recommend"].open(folder, EngineOptions(coarse_from=0))
    assert "coarse" in wide.scoring and "coarse" not in plain.scoring
    queries = [RecQuery(u, k=5, exclude_items=["i1", "i2"]) for u in stored_users(load_artifact(folder))]
    queries.append(RecQuery(None, [("i3", None, None), ("i4", None, None)], k=50, exclude_seen=False))
    for got, want in zip(wide.answer(queries), plain.answer(queries), strict=True):
        assert [i for i, _ in got.items] == [i for i, _ in want.items]
        assert [s for _, s in got.items] == pytest.approx([s for _, s in want.items], abs=1e-5)
        assert got.excluded == want.excluded
        assert (got.floor == want.floor and len(got.floor) == 10) or got.user_id is None
