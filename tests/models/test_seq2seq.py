import pytest
import torch

from models.ids import PAD
from models.layers import Attention, causal_attention_mask, decoder_mask, key_padding_mask
from models.seq2seq import BOS, EOS, FIRST_TOKEN, Seq2Seq, Seq2SeqConfig
from training.jobs.copy import collate
from training.preflight import PreflightError, preflight_seq2seq


def _model(**kw: object) -> Seq2Seq:
    torch.manual_seed(0)
    return Seq2Seq(Seq2SeqConfig(vocab_size=12, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, **kw)).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    b = collate([[3, 4, 5, 6, 7], [8, 9], [5, 5, 5]])
    return b.src, b.tgt_in


def test_mask_shapes_and_meaning() -> None:
    seq = torch.tensor([[5, 6, PAD], [7, PAD, PAD]])
    pad = key_padding_mask(seq)
    assert pad.dtype == torch.bool and pad.shape == (2, 1, 1, 3)
    assert pad[0, 0, 0].tolist() == [False, False, True]
    causal = causal_attention_mask(3)
    assert causal.shape == (1, 1, 3, 3) and causal[0, 0].tolist() == [
        [False, True, True],
        [False, False, True],
        [False, False, False],
    ]
    dec = decoder_mask(seq)
    assert dec.shape == (2, 1, 3, 3) and torch.equal(dec, pad | causal)
    assert dec[1, 0, 2].tolist() == [False, True, True]  # padding hides key 1 even below the diagonal


def test_attention_hides_masked_keys_and_zeroes_fully_hidden_rows() -> None:
    torch.manual_seed(0)
    attn = Attention(8, 2).eval()
    x = torch.randn(1, 3, 8)
    mask = torch.tensor([[False, True, False], [True, True, True], [False, False, False]])[None, None]
    out, w = attn(x, x, mask, need_weights=True)
    assert w is not None and w.shape == (1, 2, 3, 3)
    assert torch.all(w[..., 0, 1] == 0) and torch.all(w[..., 1, :] == 0)
    fast, _ = attn(x, x, mask)
    assert torch.allclose(out, fast, atol=1e-6) and torch.isfinite(fast).all()
    # A hidden key's value has no effect on any query.
    x2 = x.clone()
    x2[0, 1] += 5.0
    assert torch.allclose(attn(x, x2, mask)[0][0, [0]], fast[0, [0]], atol=1e-6)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_logits_shape_causality_and_padding(positions: str) -> None:
    model = _model(positions=positions)
    src, tgt = _batch()
    logits = model(src, tgt)
    assert logits.shape == (3, tgt.size(1), 12)
    changed = tgt.clone()
    changed[:, -1] = FIRST_TOKEN
    assert torch.allclose(model(src, changed)[:, :-1], logits[:, :-1], atol=1e-5)
    # Padding the source further changes nothing for the real positions.
    longer = torch.cat([src, torch.full((3, 4), PAD)], 1)
    assert torch.allclose(model(longer, tgt), logits, atol=1e-5)


def test_one_attention_map_per_layer() -> None:
    model = _model()
    src, tgt = _batch()
    _, maps = model.attention_maps(src, tgt)
    assert [m.shape for m in maps.encoder] == [(3, 2, src.size(1), src.size(1))] * 2
    assert [m.shape for m in maps.decoder_cross] == [(3, 2, tgt.size(1), src.size(1))] * 2
    # Row 1's source is [8, 9, EOS, PAD, PAD, PAD]: no query attends to its padding.
    assert all(torch.all(m[1, ..., 3:] == 0) for m in maps.decoder_cross)
    assert all(torch.all(m.triu(1) == 0) for m in maps.decoder_self)


def test_greedy_stops_each_row_at_eos_and_all_at_max_len(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    src, _ = _batch()
    real_decode = model.decode

    def scripted(tgt_in: torch.Tensor, memory: torch.Tensor, src_pad: torch.Tensor, need_weights: bool = False):
        # Row 0 says EOS at its 2nd step, row 1 at its 4th, row 2 never; otherwise token 5.
        logits, a, b = real_decode(tgt_in, memory, src_pad, need_weights)
        step = tgt_in.size(1)
        logits = torch.zeros_like(logits)
        logits[..., 5] = 1.0
        for row, at in ((0, 2), (1, 4)):
            if step == at:
                logits[row, -1, EOS] = 2.0
        return logits, a, b

    monkeypatch.setattr(model, "decode", scripted)
    out = model.greedy(src, max_len=6).tolist()
    assert out[0] == [5, EOS, PAD, PAD, PAD, PAD]
    assert out[1] == [5, 5, 5, EOS, PAD, PAD]
    assert out[2] == [5] * 6  # no EOS: stopped by max_len
    assert all(BOS not in row for row in out)


def test_preflight_names_the_broken_check(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    batch = collate([[3, 4, 5, 6, 7], [8, 9], [5, 5, 5]])
    preflight_seq2seq(model, batch)  # the real model passes
    import models.seq2seq as s2s

    # A decoder that sees the future: no causal part in its mask.
    monkeypatch.setattr(s2s, "decoder_mask", key_padding_mask)
    with pytest.raises(PreflightError, match="'causal'") as err:
        preflight_seq2seq(model, batch)
    assert err.value.check == "causal"
    monkeypatch.undo()
    # An encoder that attends to padding.
    monkeypatch.setattr(s2s, "key_padding_mask", lambda seq: torch.zeros_like(key_padding_mask(seq)))
    with pytest.raises(PreflightError, match="'padding'"):
        preflight_seq2seq(model, batch)
