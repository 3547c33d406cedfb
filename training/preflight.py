"""Checks on one batch before training: shapes, mask logic, padding invariance. Fail fast."""

from __future__ import annotations

import torch

from models.base import SequentialRecommender
from models.ids import N_SPECIAL, PAD
from models.layers import causal_attention_mask, causal_mask, decoder_mask, key_padding_mask, padding_mask
from models.seq2seq import FIRST_TOKEN, Seq2Seq, Seq2SeqBatch


class PreflightError(RuntimeError):
    """A check on a real batch failed before training; the message names the check."""

    def __init__(self, check: str, message: str) -> None:
        super().__init__(f"pre-flight check {check!r} failed: {message}")
        self.check = check


def _require(cond: bool, message: str, check: str) -> None:
    if not cond:
        raise PreflightError(check, message)


def preflight_seq2seq(model: Seq2Seq, batch: Seq2SeqBatch) -> None:
    """The copy task's checks, each failing with its name. Eval mode; restores the model's mode."""
    was_training = model.training
    model.eval()
    try:
        src, tgt = batch.src[:8], batch.tgt_in[:8]
        b, s, t, v = src.size(0), src.size(1), tgt.size(1), model.config.vocab_size
        with torch.no_grad():
            logits, maps = model.attention_maps(src, tgt)
            _require(logits.shape == (b, t, v), f"logits {tuple(logits.shape)} != {(b, t, v)}", "logits_shape")
            pad, causal, dec = key_padding_mask(src), causal_attention_mask(t), decoder_mask(tgt)
            _require(pad.dtype == causal.dtype == dec.dtype == torch.bool, "masks must be bool", "mask_dtypes")
            _require(
                pad.shape == (b, 1, 1, s) and causal.shape == (1, 1, t, t) and dec.shape == (b, 1, t, t),
                f"mask shapes {tuple(pad.shape)}, {tuple(causal.shape)}, {tuple(dec.shape)}",
                "mask_shapes",
            )
            # Causal: a different last target token changes nothing at earlier positions.
            if t >= 2:
                changed = tgt.clone()
                changed[:, -1] = FIRST_TOKEN + (changed[:, -1] - FIRST_TOKEN + 1) % (v - FIRST_TOKEN)
                again = model(src, changed)
                _require(
                    torch.allclose(logits[:, :-1], again[:, :-1], atol=1e-5),
                    "a later target token changed an earlier position's logits",
                    "causal",
                )
            # Padding: other tokens in the padded source positions, behind the same mask, change nothing.
            hidden = key_padding_mask(src)
            if bool(hidden.any()):
                noisy = src.masked_fill(src == PAD, FIRST_TOKEN)
                again = model(noisy, tgt, src_pad=hidden)
                _require(
                    torch.allclose(logits, again, atol=1e-5), "padded source positions changed the outputs", "padding"
                )
            n = model.config.n_layers
            shapes = (
                [m.shape for m in maps.encoder] == [(b, model.config.n_heads, s, s)] * n
                and [m.shape for m in maps.decoder_self] == [(b, model.config.n_heads, t, t)] * n
                and [m.shape for m in maps.decoder_cross] == [(b, model.config.n_heads, t, s)] * n
            )
            _require(
                shapes,
                "expected one (B, H, Lq, Lk) map per layer for encoder, decoder self and cross",
                "attention_maps",
            )
    finally:
        model.train(was_training)


def preflight(model: SequentialRecommender, batch: torch.Tensor, vocab_size: int) -> None:
    """Run on a real training batch (B, L) in eval mode; restores the model's mode."""
    was_training = model.training
    model.eval()
    try:
        seq = batch[:4, : model.max_history].clone()
        seq = seq[(seq != PAD).any(1)]
        _require(len(seq) > 0, "the first batch holds no non-empty sequence", "batch")
        with torch.no_grad():
            pm = padding_mask(seq)
            _require(
                pm.dtype == torch.bool and pm.shape == seq.shape, "padding mask must be bool (B, L)", "mask_dtypes"
            )
            cm = causal_mask(5)
            _require(
                cm.dtype == torch.bool and bool(cm[0, 1]) and not bool(cm[1, 0]),
                "causal mask must hide later positions only",
                "mask_logic",
            )
            scores = model.scores(seq)
            _require(
                scores.shape == (len(seq), vocab_size),
                f"scores shape {tuple(scores.shape)} != {(len(seq), vocab_size)}",
                "scores_shape",
            )
            _require(bool(torch.isinf(scores[:, :N_SPECIAL]).all()), "padding/unknown must score -inf", "specials")
            _require(bool(torch.isfinite(scores[:, N_SPECIAL:]).all()), "item scores must be finite", "finite")
            h = model(seq)
            _require(
                h.dim() == 3 and h.shape[:2] == seq.shape,
                f"hidden shape {tuple(h.shape)} is not (B, L, D)",
                "hidden_shape",
            )
            # Extra padding must not change any non-padded output.
            padded = torch.cat([seq, torch.zeros_like(seq[:, :3])], 1)[:, : model.max_history]
            h2 = model(padded)[:, : seq.size(1)]
            valid = ~pm
            _require(torch.allclose(h[valid], h2[valid], atol=1e-5), "padding changes non-padded outputs", "padding")
            if getattr(type(model), "causal", False):
                # Changing the last valid item must leave every earlier position untouched.
                lengths = valid.sum(1)
                row = int(lengths.argmax())
                n = int(lengths[row])
                if n >= 2:
                    changed = seq[row : row + 1].clone()
                    changed[0, n - 1] = N_SPECIAL + (int(changed[0, n - 1]) - N_SPECIAL + 1) % (vocab_size - N_SPECIAL)
                    h3 = model(changed)
                    _require(
                        torch.allclose(h[row, : n - 1], h3[0, : n - 1], atol=1e-5),
                        "the causal mask lets a position see the future",
                        "causal",
                    )
    finally:
        model.train(was_training)
