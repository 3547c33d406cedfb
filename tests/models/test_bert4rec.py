import torch

from models.bert4rec import cloze

MASK, V = 1000, 1000


def test_cloze_proportions() -> None:
    torch.manual_seed(0)
    seq = torch.randint(2, V, (400, 200))
    seq[:, 150:] = 0  # padding is never chosen
    inputs, labels = cloze(seq, 0.15, MASK, V)
    chosen = labels != 0
    assert not chosen[:, 150:].any()
    assert torch.equal(labels[chosen], seq[chosen])
    rate = chosen[:, :150].float().mean().item()
    assert abs(rate - 0.15) < 0.01
    masked = (inputs == MASK) & chosen
    unchanged = (inputs == seq) & chosen
    n = chosen.sum().item()
    assert abs(masked.sum().item() / n - 0.8) < 0.02
    # 10% kept plus the random draws that happen to hit the same item (negligible with 1000 items).
    assert abs(unchanged.sum().item() / n - 0.1) < 0.02
    assert not ((inputs == MASK) & ~chosen).any()  # nothing outside the chosen positions changes
    assert torch.equal(inputs[~chosen], seq[~chosen])


def test_every_row_gets_a_target_and_last_item_rows() -> None:
    torch.manual_seed(1)
    seq = torch.tensor([[5, 0, 0], [5, 6, 0]] * 50)
    _, labels = cloze(seq, 0.01, MASK, V)
    assert ((labels != 0).sum(1) >= 1).all()
    inputs, labels = cloze(seq, 0.15, MASK, V, last_item_prob=1.0)
    lengths = (seq != 0).sum(1)
    rows = torch.arange(len(seq))
    assert ((labels != 0).sum(1) == 1).all()
    assert (inputs[rows, lengths - 1] == MASK).all()
