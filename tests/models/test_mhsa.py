import torch

from models.features import duration_bin, hour_quarter, time_slot
from models.mhsa import MHSA, MHSAConfig
from models.staypoints import collate_staypoints


def test_bucketing_worked_example() -> None:
    slot = time_slot(torch.tensor([510]))
    hour, quarter = hour_quarter(slot)
    assert (slot.item(), hour.item(), quarter.item()) == (34, 8, 2)
    assert duration_bin(torch.tensor([120])).item() == 4
    assert duration_bin(torch.tensor([5000, 2879, 0])).tolist() == [95, 95, 0]  # capped at 2879 min


def _model(pointer: bool) -> MHSA:
    torch.manual_seed(0)
    return MHSA(
        MHSAConfig(n_locations=20, n_users=5, d_model=16, n_heads=2, d_ff=32, n_layers=2, pointer=pointer)
    ).eval()


def test_collate_right_pads_and_truncates() -> None:
    b = collate_staypoints([[(3, 510, 1, 120), (4, 0, 2, 30)], [(5, 1439, 6, 10_000)]], [2, 0], [7, 8], max_len=5)
    assert b.loc.tolist() == [[3, 4], [5, 0]]
    assert b.hour.tolist()[0] == [8, 0] and b.quarter.tolist()[0] == [2, 0] and b.duration.tolist()[1] == [95, 0]
    t = collate_staypoints([[(i + 2, 0, 0, 0) for i in range(6)]], [1], max_len=3)
    assert t.loc.tolist() == [[5, 6, 7]]  # the most recent steps


def test_causal_and_padding_masks() -> None:
    for pointer in (False, True):
        m = _model(pointer)
        a = collate_staypoints([[(3, 60, 0, 30), (4, 120, 0, 30), (5, 180, 0, 30)]], [2])
        b = collate_staypoints([[(3, 60, 0, 30), (4, 120, 0, 30), (9, 900, 3, 300)]], [2])
        with torch.no_grad():
            assert torch.allclose(m.encode(a)[0, :2], m.encode(b)[0, :2], atol=1e-6)
            # Ragged batch: each row's answer is what it gets alone.
            both = collate_staypoints([[(3, 60, 0, 30)], [(3, 60, 0, 30), (4, 120, 0, 30), (5, 180, 0, 30)]], [2, 2])
            alone = [
                collate_staypoints([r], [2])
                for r in ([(3, 60, 0, 30)], [(3, 60, 0, 30), (4, 120, 0, 30), (5, 180, 0, 30)])
            ]
            out = m.scores(both)
            for i, single in enumerate(alone):
                assert torch.allclose(out[i], m.scores(single)[0], atol=1e-5)


def test_scores_are_log_probabilities_and_padding_is_never_predicted() -> None:
    for pointer in (False, True):
        m = _model(pointer)
        b = collate_staypoints([[(3, 60, 0, 30), (1, 120, 0, 30)], [(4, 0, 0, 0)]], [0, 3], [5, 1])
        with torch.no_grad():
            s = m.scores(b)
        assert s.shape == (2, 20) and torch.isinf(s[:, 0]).all()
        assert torch.allclose(s.exp().sum(1), torch.ones(2), atol=1e-5)
        assert torch.isfinite(m.loss(b))


def test_copy_head_can_point_at_the_unknown_class() -> None:
    m = _model(True)
    b = collate_staypoints([[(1, 60, 0, 30), (1, 120, 0, 30)]], [0], [1])
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    m.train()
    for _ in range(30):
        loss = m.loss(b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    with torch.no_grad():
        assert m.scores(b).argmax(1).item() == 1
