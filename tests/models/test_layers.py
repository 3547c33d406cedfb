import pytest
import torch
import torch.nn.functional as F

from models.bert4rec import BERT4Rec, BERT4RecConfig
from models.ids import PAD
from models.layers import causal_mask, cross_entropy, gather_last, last_valid_index, padding_mask
from models.sasrec import SASRec, SASRecConfig

V = 50


def _models() -> list[torch.nn.Module]:
    torch.manual_seed(0)
    cfg = {"vocab_size": V, "max_len": 12, "d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32}
    return [SASRec(SASRecConfig(**cfg)).eval(), BERT4Rec(BERT4RecConfig(**cfg)).eval()]


def test_masks_dtype_and_logic() -> None:
    seq = torch.tensor([[5, 6, 0], [7, 0, 0]])
    assert padding_mask(seq).dtype == torch.bool
    assert padding_mask(seq).tolist() == [[False, False, True], [False, True, True]]
    cm = causal_mask(3)
    assert cm.dtype == torch.bool
    assert cm.tolist() == [[False, True, True], [False, False, True], [False, False, False]]


def test_last_valid_gather_with_ragged_lengths() -> None:
    seq = torch.tensor([[3, 4, 5, 0], [3, 0, 0, 0], [3, 4, 5, 6]])
    assert last_valid_index(seq).tolist() == [2, 0, 3]
    hidden = torch.arange(3 * 4 * 2, dtype=torch.float).reshape(3, 4, 2)
    out = gather_last(hidden, seq)
    assert out.shape == (3, 2)
    assert torch.equal(out[0], hidden[0, 2]) and torch.equal(out[1], hidden[1, 0])
    assert torch.equal(out[2], hidden[2, 3])


@pytest.mark.parametrize("model", _models(), ids=["sasrec", "bert4rec"])
def test_padding_does_not_change_outputs(model: torch.nn.Module) -> None:
    seq = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]])
    longer = torch.cat([seq, torch.zeros(2, 4, dtype=torch.long)], 1)
    with torch.no_grad():
        h1, h2 = model(seq), model(longer)[:, :5]
        valid = seq != PAD
        assert torch.allclose(h1[valid], h2[valid], atol=1e-5)
        s1 = model.scores(seq[:, : model.max_history])
        s2 = model.scores(longer[:, : model.max_history])
        assert torch.allclose(s1, s2, atol=1e-5)


def test_causal_mask_hides_the_future() -> None:
    model = _models()[0]
    a = torch.tensor([[5, 6, 7, 8]])
    b = torch.tensor([[5, 6, 7, 30]])
    with torch.no_grad():
        ha, hb = model(a), model(b)
    assert torch.allclose(ha[0, :3], hb[0, :3], atol=1e-6)
    assert not torch.allclose(ha[0, 3], hb[0, 3])


def test_bidirectional_model_sees_both_sides() -> None:
    model = _models()[1]
    a = torch.tensor([[5, 6, 7, 8]])
    b = torch.tensor([[5, 6, 7, 30]])
    with torch.no_grad():
        assert not torch.allclose(model(a)[0, 0], model(b)[0, 0])


@pytest.mark.parametrize("model", _models(), ids=["sasrec", "bert4rec"])
def test_scores_shape_and_specials_never_rank(model: torch.nn.Module) -> None:
    seq = torch.tensor([[5, 6, 0], [7, 0, 0]])
    with torch.no_grad():
        s = model.scores(seq)
    assert s.shape == (2, V)  # the [MASK] token (index V) is not a candidate
    assert torch.isinf(s[:, :2]).all() and torch.isfinite(s[:, 2:]).all()


@pytest.mark.parametrize("model", _models(), ids=["sasrec", "bert4rec"])
def test_loss_is_finite_and_backpropagates(model: torch.nn.Module) -> None:
    model.train()
    seq = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    loss = model.loss(seq)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    emb = model.encoder.token_emb.weight.grad
    assert emb is not None and emb.abs().sum() > 0
    model.eval()


def test_sasrec_losses_all_train() -> None:
    for loss in ("sampled_softmax", "softmax", "bce"):
        m = SASRec(
            SASRecConfig(vocab_size=V, max_len=8, d_model=8, n_heads=1, n_layers=1, d_ff=16, loss=loss, n_negatives=10)
        )
        assert torch.isfinite(m.loss(torch.tensor([[5, 6, 7, 0]])))
    with pytest.raises(ValueError):
        SASRecConfig(vocab_size=V, loss="nope")


def test_auto_loss_is_the_full_softmax_up_to_four_times_the_negatives() -> None:
    assert SASRecConfig(vocab_size=4096, loss="auto", n_negatives=1024).training_loss == "softmax"
    assert SASRecConfig(vocab_size=4097, loss="auto", n_negatives=1024).training_loss == "sampled_softmax"
    assert SASRecConfig(vocab_size=4097, loss="bce").training_loss == "bce"
    # The resolved loss is what trains: the full softmax's value is the NLL over every item.
    torch.manual_seed(0)
    m = SASRec(SASRecConfig(vocab_size=V, max_len=8, d_model=8, n_heads=1, n_layers=1, d_ff=16, loss="auto"))
    m.eval()
    seq = torch.tensor([[5, 6, 7, 0]])
    logits = m(seq[:, :-1]) @ m.item_weights().T
    logits[..., :2] = float("-inf")
    expected = torch.nn.functional.cross_entropy(logits[0, :2], seq[0, 1:3])
    assert torch.allclose(m.loss(seq), expected)


def test_negative_sampler_mixes_and_corrects() -> None:
    from models.layers import NegativeSampler

    torch.manual_seed(0)
    s = NegativeSampler(vocab_size=12, n_negatives=4000, pop_share=0.5)
    counts = torch.tensor([0, 0, 100, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    s.set_frequencies(counts)
    neg, corr = s(torch.device("cpu"))
    assert neg.min() >= 2 and neg.max() < 12  # never padding or unknown
    share = (neg == 2).float().mean().item()  # 0.5 * 100/109 + 0.5 * 1/10
    assert abs(share - (0.5 * 100 / 109 + 0.05)) < 0.03
    q = 0.5 * counts[neg].float() / 109 + 0.5 / 10
    assert torch.allclose(corr, torch.log(4000 * q))
    plain = NegativeSampler(vocab_size=12, n_negatives=10, pop_share=1.0, correct=False)
    assert torch.equal(plain(torch.device("cpu"))[1], torch.zeros(10))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_layers", [1, 3])
def test_read_equals_forward_at_the_read_position(causal: bool, n_layers: int) -> None:
    """Serving's shortcut (the last layer computes only the row read) gives forward()'s numbers."""
    from models.layers import SequenceEncoder

    torch.manual_seed(0)
    enc = SequenceEncoder(50, 12, d_model=16, n_heads=2, n_layers=n_layers, d_ff=32, dropout=0.1, causal=causal).eval()
    seq = torch.tensor([[5, 6, 7, 8, 9, 10, 0, 0], [11, 12, 0, 0, 0, 0, 0, 0], [3, 4, 5, 6, 7, 8, 9, 10]])
    at = torch.tensor([5, 1, 4])  # the last item, or (row 3) a position before the end
    for ctx in (torch.no_grad, torch.inference_mode):  # the fused fast path runs under inference_mode
        with ctx():
            full = enc(seq)[torch.arange(3), at]
            assert torch.allclose(enc.read(seq, at), full, atol=1e-5)


@pytest.mark.parametrize("attn_out_dropout", [True, False])
def test_attention_output_dropout_is_off_when_the_config_says_so(attn_out_dropout: bool) -> None:
    """With the feed-forward branch zeroed and no dropout on the attention weights, a training-mode
    pass of the recommender's encoder layer differs from eval only through dropout on the attention
    output, which `attn_out_dropout=False` removes."""
    torch.manual_seed(0)
    shape = dict(vocab_size=30, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=16)
    cfg = SASRecConfig(**shape, dropout=0.5, attn_out_dropout=attn_out_dropout)
    layer = SASRec(cfg).encoder.layers.layers[0]
    layer.attn.dropout = 0.0
    torch.nn.init.zeros_(layer.ff[3].weight)
    torch.nn.init.zeros_(layer.ff[3].bias)
    x = torch.randn(3, 8, 16)
    train_out, _ = layer.train()(x, None, causal=True)
    eval_out, _ = layer.eval()(x, None, causal=True)
    assert torch.allclose(train_out, eval_out, atol=1e-6) is not attn_out_dropout


def test_smoothed_cross_entropy_spreads_over_the_finite_logits_only() -> None:
    torch.manual_seed(0)
    logits, target = torch.randn(6, 10), torch.randint(2, 10, (6,))
    assert torch.allclose(cross_entropy(logits, target), F.cross_entropy(logits, target))
    assert torch.allclose(
        cross_entropy(logits, target, smoothing=0.2), F.cross_entropy(logits, target, label_smoothing=0.2)
    )
    # The specials (and a masked negative) are not classes: the smoothed share never reaches them.
    logits[:, :2] = float("-inf")
    smoothed = cross_entropy(logits, target, smoothing=0.2)
    assert torch.isfinite(smoothed)
    assert torch.allclose(smoothed, F.cross_entropy(logits[:, 2:], target - 2, label_smoothing=0.2))


@pytest.mark.parametrize("loss", ["softmax", "sampled_softmax"])
def test_label_smoothing_changes_the_training_loss_and_stays_finite(loss: str) -> None:
    cfg = {"vocab_size": V, "max_len": 8, "d_model": 8, "n_heads": 1, "n_layers": 1, "d_ff": 16, "loss": loss}
    seq = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]])
    values = []
    for smoothing in (0.0, 0.3):
        torch.manual_seed(0)
        m = SASRec(SASRecConfig(**cfg, n_negatives=10, label_smoothing=smoothing)).eval()
        torch.manual_seed(1)  # the same shared negatives for both
        values.append(m.loss(seq))
    assert all(torch.isfinite(v) for v in values)
    assert not torch.allclose(values[0], values[1])  # the setting reaches the loss that trains
    with pytest.raises(ValueError, match="label_smoothing"):
        SASRecConfig(vocab_size=V, label_smoothing=1.0)
