import pytest
import torch
import torch.nn.functional as F

from models.bert4rec import BERT4Rec, BERT4RecConfig, cloze
from models.ids import PAD
from models.layers import (
    Dropout,
    causal_mask,
    gather_last,
    gather_rows,
    last_valid_index,
    length_groups,
    padding_mask,
    shared_negatives_loss,
)
from models.sasrec import SASRec, SASRecConfig

V = 50


def _models(**extra: object) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    cfg = {"vocab_size": V, "max_len": 12, "d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32, **extra}
    return [SASRec(SASRecConfig(**cfg)).eval(), BERT4Rec(BERT4RecConfig(**cfg)).eval()]


# Every model test runs on the plain encoder and on each filter the encoder offers.
FILTERS = {
    "": {},
    "-bsa": {"filter_kind": "bsa", "filter_mix": 0.7},
    "-learned": {"filter_kind": "learned", "filter_mix": 1.0},
    "-tv": {"filter_kind": "tv", "filter_mix": 0.5, "filter_bases": 3},
}
MODELS = [m for opts in FILTERS.values() for m in _models(**opts)]
MODEL_IDS = [f"{name}{suffix}" for suffix in FILTERS for name in ("sasrec", "bert4rec")]


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


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
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


@pytest.mark.parametrize("model", MODELS[::2], ids=MODEL_IDS[::2])
def test_causal_mask_hides_the_future(model: torch.nn.Module) -> None:
    a = torch.tensor([[5, 6, 7, 8]])
    b = torch.tensor([[5, 6, 7, 30]])
    with torch.no_grad():
        ha, hb = model(a), model(b)
    assert torch.allclose(ha[0, :3], hb[0, :3], atol=1e-6)
    assert not torch.allclose(ha[0, 3], hb[0, 3])


@pytest.mark.parametrize("model", MODELS[1::2], ids=MODEL_IDS[1::2])
def test_bidirectional_model_sees_both_sides(model: torch.nn.Module) -> None:
    a = torch.tensor([[5, 6, 7, 8]])
    b = torch.tensor([[5, 6, 7, 30]])
    with torch.no_grad():
        assert not torch.allclose(model(a)[0, 0], model(b)[0, 0])


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_scores_shape_and_specials_never_rank(model: torch.nn.Module) -> None:
    seq = torch.tensor([[5, 6, 0], [7, 0, 0]])
    with torch.no_grad():
        s = model.scores(seq)
    assert s.shape == (2, V)  # the [MASK] token (index V) is not a candidate
    assert torch.isinf(s[:, :2]).all() and torch.isfinite(s[:, 2:]).all()


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
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
@pytest.mark.parametrize("filter_opts", FILTERS.values(), ids=[k or "plain" for k in FILTERS])
def test_read_equals_forward_at_the_read_position(causal: bool, n_layers: int, filter_opts: dict) -> None:
    """Serving's shortcut (the last layer computes only the row read) gives forward()'s numbers."""
    from models.layers import SequenceEncoder

    torch.manual_seed(0)
    enc = SequenceEncoder(
        50, 12, d_model=16, n_heads=2, n_layers=n_layers, d_ff=32, dropout=0.1, causal=causal, **filter_opts
    ).eval()
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


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, smoothing: float = 0.0) -> torch.Tensor:
    """The reference: mean cross-entropy with `smoothing` spread over the finite logits only."""
    logp = F.log_softmax(logits, -1)
    nll = -logp.gather(1, target[:, None]).squeeze(1)
    finite = torch.isfinite(logits)
    uniform = -logp.masked_fill(~finite, 0.0).sum(-1) / finite.sum(-1)
    return ((1.0 - smoothing) * nll + smoothing * uniform).mean()


def test_reference_cross_entropy_is_torchs_over_the_finite_logits() -> None:
    torch.manual_seed(0)
    logits, target = torch.randn(6, 10), torch.randint(2, 10, (6,))
    assert torch.allclose(
        cross_entropy(logits, target, smoothing=0.2), F.cross_entropy(logits, target, label_smoothing=0.2)
    )
    logits[:, :2] = float("-inf")
    smoothed = cross_entropy(logits, target, smoothing=0.2)
    assert torch.allclose(smoothed, F.cross_entropy(logits[:, 2:], target - 2, label_smoothing=0.2))


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_shared_negatives_loss_drops_a_rows_own_target_from_its_negatives(smoothing: float) -> None:
    torch.manual_seed(0)
    pos = torch.tensor([5, 7, 9, 5, 11])
    neg = torch.tensor([5, 3, 7, 5, 8, 20])  # row 0 and 3's target twice, row 1's once, the others never
    h = torch.randn(5, 4, requires_grad=True)
    table = torch.randn(30, 4)
    got = shared_negatives_loss((h * table[pos]).sum(-1), h @ table[neg].T, pos, neg, smoothing=smoothing)
    (g_got,) = torch.autograd.grad(got, h)
    pos_logit, neg_logit = (h * table[pos]).sum(-1), h @ table[neg].T
    masked = neg_logit.masked_fill(neg[None, :] == pos[:, None], float("-inf"))
    want = cross_entropy(torch.cat([pos_logit[:, None], masked], 1), torch.zeros_like(pos), smoothing=smoothing)
    (g_want,) = torch.autograd.grad(want, h)
    assert torch.isfinite(got)
    assert torch.allclose(got, want, atol=1e-6) and torch.allclose(g_got, g_want, atol=1e-6)


def test_shared_negatives_loss_takes_the_logits_bf16_autocast_gives_it() -> None:
    """Under bf16 autocast (CUDA training) the (N, K) product is bfloat16 and the row sums float32."""
    torch.manual_seed(0)
    pos, neg = torch.tensor([5, 7, 9, 5]), torch.tensor([5, 3, 7, 8, 20])
    h, table = torch.randn(4, 8, requires_grad=True), torch.randn(30, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pos_logit, neg_logit = (h * table[pos]).sum(-1), h @ table[neg].T
    assert (pos_logit.dtype, neg_logit.dtype) == (torch.float32, torch.bfloat16)
    got = shared_negatives_loss(pos_logit, neg_logit, pos, neg, smoothing=0.1)
    want = shared_negatives_loss(pos_logit, neg_logit.float(), pos, neg, smoothing=0.1)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    got.backward()
    assert h.grad is not None and torch.isfinite(h.grad).all()


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


def test_length_groups_cover_every_row_once_and_cut_to_the_longest() -> None:
    lengths = torch.tensor([3, 9, 1, 7, 7, 2, 5])
    groups = length_groups(lengths, 3, min_rows=1)
    rows = torch.cat([r for r, _ in groups])
    assert sorted(rows.tolist()) == list(range(7))
    for r, n in groups:
        assert n == int(lengths[r].max())
    assert [n for _, n in groups] == sorted(n for _, n in groups)  # short rows together, long together
    assert len(length_groups(lengths, 20, min_rows=1)) == 7  # never an empty group
    assert len(length_groups(lengths, 3, min_rows=3)) == 2  # at least 3 rows each
    assert len(length_groups(lengths, 3)) == 1  # a batch of 7 stays whole


def test_gather_rows_is_indexing_with_one_gradient_and_none_for_padding() -> None:
    table = torch.randn(10, 4, requires_grad=True)
    a, b = torch.tensor([[1, 2], [0, 3]]), torch.tensor([3, 3, 9])
    ra, rb = gather_rows(table, a, b)
    assert torch.equal(ra, table[a]) and torch.equal(rb, table[b])
    (ra.sum() + rb.sum()).backward()
    assert table.grad is not None
    expected = torch.zeros(10)
    expected[[1, 2, 3, 9]] = torch.tensor([1.0, 1.0, 3.0, 1.0])  # PAD (0) gets nothing, as in the embedding
    assert torch.equal(table.grad[:, 0], expected)


def _reference_sasrec_loss(m: SASRec, seq: torch.Tensor) -> torch.Tensor:
    """The whole batch at once, every table row looked up apart, specials masked with -inf."""
    cfg = m.config
    inp, target = seq[:, :-1], seq[:, 1:]
    valid = target != PAD
    h, pos, w = m(inp)[valid], target[valid], m.item_weights()
    if cfg.training_loss == "softmax":
        logits = h @ w.T
        logits[:, :2] = float("-inf")
        return cross_entropy(logits, pos, smoothing=cfg.label_smoothing)
    neg, correction = m.sampler(pos.device)
    neg_logit = (h @ w[neg].T - correction).masked_fill(neg[None, :] == pos[:, None], float("-inf"))
    logits = torch.cat([(h * w[pos]).sum(-1, keepdim=True), neg_logit], dim=1)
    return cross_entropy(logits, torch.zeros_like(pos), smoothing=cfg.label_smoothing)


@pytest.mark.parametrize("loss", ["softmax", "sampled_softmax"])
def test_sasrec_loss_in_length_groups_is_the_whole_batch_loss(loss: str) -> None:
    torch.manual_seed(0)
    cfg = {"vocab_size": V, "max_len": 10, "d_model": 8, "n_heads": 1, "n_layers": 2, "d_ff": 16, "dropout": 0.0}
    m = SASRec(SASRecConfig(**cfg, loss=loss, n_negatives=20, label_smoothing=0.1)).train()
    lengths = torch.randint(2, 12, (300,))  # 8 groups of at least 32 rows
    seq = torch.randint(2, V, (300, 11)) * (torch.arange(11)[None, :] < lengths[:, None])
    values, grads = [], []
    for fn in (_reference_sasrec_loss, SASRec.loss):
        m.zero_grad()
        torch.manual_seed(1)  # the same shared negatives
        value = fn(m, seq)
        value.backward()
        values.append(value.detach())
        grads.append({k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None})
    assert torch.allclose(values[0], values[1], atol=1e-6)
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], atol=1e-6), k


def test_bert4rec_loss_in_length_groups_is_the_whole_batch_loss() -> None:
    torch.manual_seed(0)
    cfg = {"vocab_size": V, "max_len": 10, "d_model": 8, "n_heads": 1, "n_layers": 2, "d_ff": 16, "dropout": 0.0}
    m = BERT4Rec(BERT4RecConfig(**cfg, label_smoothing=0.1)).train()
    lengths = torch.randint(1, 11, (300,))  # 8 groups of at least 32 rows
    seq = torch.randint(2, V, (300, 10)) * (torch.arange(10)[None, :] < lengths[:, None])
    torch.manual_seed(1)
    inputs, labels = cloze(seq, m.config.mask_prob, m.mask_token, V, m.config.last_item_prob)
    chosen = labels != PAD
    logits = m.transform(m(inputs)[chosen]) @ m.encoder.token_emb.weight[:V].T + m.out_bias
    logits[:, :2] = float("-inf")
    expected = cross_entropy(logits, labels[chosen], smoothing=0.1)
    torch.manual_seed(1)  # the same corruption
    assert torch.allclose(m.loss(seq), expected, atol=1e-6)


def test_dropout_drops_its_share_scales_the_rest_and_is_the_identity_in_eval() -> None:
    torch.manual_seed(0)
    d = Dropout(0.6)
    x = torch.ones(200_000, requires_grad=True)
    y = d(x)
    kept = y != 0
    assert abs(1.0 - kept.float().mean().item() - 0.6) < 0.01
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.4))
    y.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, y.detach())  # the gradient passes where the value did
    assert torch.equal(d.eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)


def test_bsa_low_pass_is_bsarecs_fft_cut() -> None:
    """The fixed filter is BSARec's: rfft over the positions, the first c // 2 + 1 frequencies kept, irfft."""
    from models.sequence_filters import low_pass_matrix

    x = torch.randn(3, 12, 4)
    spec = torch.fft.rfft(x, dim=1, norm="ortho")
    spec[:, 9 // 2 + 1 :] = 0
    assert torch.allclose(low_pass_matrix(12, 9) @ x, torch.fft.irfft(spec, n=12, dim=1, norm="ortho"), atol=1e-5)


@pytest.mark.parametrize("kind", ["bsa", "learned"])
def test_a_causal_filter_gives_each_position_the_frame_ending_there(kind: str) -> None:
    """Position t of a causal filter = the filter at the last position of the max_len frame ending at t,
    zeros before the start (the one position BSARec and FMLP-Rec predict from)."""
    from models.sequence_filters import FilterSpec, SequenceFilter, low_pass_matrix

    torch.manual_seed(0)
    n, d = 6, 3
    f = SequenceFilter(FilterSpec(kind, 1.0, 5, n, causal=True), d)
    x = torch.randn(2, n, d)
    out = f(x, None)
    for t in range(n):
        frame = torch.cat([torch.zeros(2, n - 1 - t, d), x[:, : t + 1]], 1)  # (B, n, D), ending at t
        if kind == "bsa":
            low = (low_pass_matrix(n, 5) @ frame)[:, -1]
            want = low + f.sqrt_beta**2 * (x[:, t] - low)
        else:  # a learned kernel by how far back: k[0] on t itself, k[j] on t - j
            want = sum(f.kernel[j] * frame[:, n - 1 - j] for j in range(n))
        assert torch.allclose(out[:, t], want, atol=1e-5), t


@pytest.mark.parametrize("causal", [True, False])
def test_a_time_variant_filter_gives_each_position_its_own_taps(causal: bool) -> None:
    """TV-Rec's filter: position t's taps are its coefficients times the bases, tap j on t - j (causal:
    nothing after t; bidirectional: the circular frame); positions differ where the learned filter's
    taps are one kernel for all."""
    from models.sequence_filters import FilterSpec, SequenceFilter

    torch.manual_seed(0)
    n, d, m = 6, 3, 2
    f = SequenceFilter(FilterSpec("tv", 1.0, 5, n, causal, bases=m), d)
    x = torch.randn(2, n, d)
    out = f(x, None)
    for t in range(n):
        taps = torch.einsum("m,mkd->kd", f.coefficients[t], f.bases)  # (n, D): position t's tap by offset
        back = range(t + 1) if causal else range(n)
        want = sum(taps[j] * x[:, (t - j) % n] for j in back)
        assert torch.allclose(out[:, t], want, atol=1e-5), t
    shifted = f(torch.cat([torch.zeros(2, 1, d), x[:, :-1]], 1), None)
    assert not torch.allclose(shifted[:, 1:], out[:, :-1], atol=1e-3)  # not shift-invariant: taps vary by position


def test_the_filter_alone_has_no_attention_and_its_weights_train() -> None:
    model = _models(filter_kind="learned", filter_mix=1.0)[0].train()
    names = [n for n, _ in model.named_parameters()]
    assert not any(".attn." in n for n in names) and any(".filter.kernel" in n for n in names)
    model.loss(torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "filter" in n)


@pytest.mark.parametrize(
    ("field", "value"), [("filter_kind", "wavelet"), ("filter_mix", 1.5), ("filter_cutoff", 0), ("filter_bases", 0)]
)
def test_filter_options_out_of_range_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SASRecConfig(vocab_size=V, **{field: value})
