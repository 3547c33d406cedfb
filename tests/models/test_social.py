import pytest
import torch

from models.social import SocialBatch, SocialConfig, SocialModel, pack_steps, time_buckets


def _model(**kw: object) -> SocialModel:
    torch.manual_seed(0)
    cfg = SocialConfig(
        n_users=12, n_actions=5, emb_dim=8, n_heads=2, n_layers=2, d_ff=16, dropout=0.0, max_history=6, **kw
    )
    return SocialModel(cfg).eval()


def _batch() -> SocialBatch:
    rows = [[(3, 2, 100.0), (4, 3, 500.0), (3, 2, 900.0)], [(7, 4, 50.0)]]
    return pack_steps(rows, query_times=[1000.0, 3600.0 * 24], max_history=6, n_buckets=48)


def test_time_buckets_are_monotone_and_zero_only_for_padding() -> None:
    secs = torch.tensor([-5.0, 0.0, 59.0, 60.0, 3600.0, 86400.0, 365 * 86400.0, 1e12])
    b = time_buckets(secs, 48)
    assert b.min() >= 1 and b.max() == 47 and torch.all(b[1:] >= b[:-1])
    assert int(b[5]) == 21  # a day


def test_pack_steps_left_pads_newest_last() -> None:
    b = _batch()
    assert b.targets.tolist() == [[3, 4, 3], [0, 0, 7]]
    assert b.actions.tolist() == [[2, 3, 2], [0, 0, 4]]
    assert b.ago[1, :2].tolist() == [0, 0] and b.ago[0, 2] < b.ago[0, 0]


@pytest.mark.parametrize("positions", ["none", "learned", "rope", "time"])
@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_scores_shape_specials_and_padding(positions: str, pooling: str) -> None:
    model = _model(positions=positions, pooling=pooling)
    b = _batch()
    s = model.scores(b)
    assert s.shape == (2, 12) and torch.isinf(s[:, :2]).all() and torch.isfinite(s[:, 2:]).all()
    # More left padding changes nothing.
    wider = SocialBatch(*(torch.cat([torch.zeros(2, 2, dtype=t.dtype), t], 1) for t in (b.targets, b.actions, b.ago)))
    assert torch.allclose(model.scores(wider), s, atol=1e-5)


def test_copy_head_puts_mass_on_history_targets() -> None:
    model = _model(positions="time")
    with torch.no_grad():
        model.copy_gate.bias.fill_(-20.0)  # all weight on copying
    p = model.scores(_batch()).exp()
    assert p[0, [3, 4]].sum() > 0.99 and p[1, 7] > 0.99


@pytest.mark.parametrize("copy_head", [True, False])
def test_loss_is_the_nll_of_the_full_distribution(copy_head: bool) -> None:
    model = _model(positions="time", copy_head=copy_head)
    b = _batch()
    b.next_target = torch.tensor([4, 9])
    full = -model.scores(b).gather(1, b.next_target[:, None]).mean()
    assert torch.allclose(model.loss(b), full, atol=1e-5)


def test_config_rejects_unknown_choices() -> None:
    with pytest.raises(ValueError, match="positions"):
        SocialConfig(positions="absolute")
    with pytest.raises(ValueError, match="pooling"):
        SocialConfig(pooling="max")


def _active(b: SocialBatch, entries: list[tuple[int, int, list[float]]]) -> SocialBatch:
    b.activity_index = torch.tensor([[r for r, _, _ in entries], [u for _, u, _ in entries]], dtype=torch.long)
    b.activity_counts = torch.tensor([c for _, _, c in entries], dtype=torch.float32).reshape(-1, 2)
    return b


@pytest.mark.parametrize("extra", [{}, {"activity_by_user": True, "activity_hidden": 4}])
def test_activity_starts_neutral_then_moves_the_active_users_only(extra: dict) -> None:
    plain, active = _model(positions="time"), _model(positions="time", activity=[3600.0], **extra)
    active.load_state_dict({**active.state_dict(), **plain.state_dict()})
    b = _active(_batch(), [(0, 5, [3.0, 0.0]), (1, 9, [0.0, 1.0]), (1, 5, [1.0, 1.0])])
    assert torch.allclose(active.scores(b), plain.scores(b), atol=1e-5)  # zero weights: the model alone
    with torch.no_grad():
        active.activity_weight.copy_(torch.tensor([0.1, 0.05]))
        if active.activity_out is not None:
            active.activity_out.weight.fill_(0.5)
    s, base = active.scores(b), plain.scores(b)
    assert torch.allclose(s.exp().sum(1), torch.ones(2), atol=1e-5)  # still a distribution
    lift = (s - base) - (s - base)[:, 2:3]  # against a user with no activity
    assert lift[0, 5] > 0 and lift[1, 9] > 0 and lift[1, 5] > 0
    assert torch.allclose(lift[0, [2, 3, 4, 6, 7, 8, 9, 10, 11]], torch.zeros(9), atol=1e-5)
    assert torch.isinf(s[:, :2]).all()
    b.next_target = torch.tensor([5, 9])
    assert torch.allclose(active.loss(b), -s.gather(1, b.next_target[:, None]).mean(), atol=1e-5)


def test_a_model_with_activity_refuses_a_batch_without() -> None:
    with pytest.raises(ValueError, match="recent activity"):
        _model(activity=[60.0]).scores(_batch())
    with pytest.raises(ValueError, match="activity windows"):
        SocialConfig(activity=[0.0])
