"""Checks on one batch before training: shapes, mask logic, padding invariance. Fail fast."""

from __future__ import annotations

import torch

from models.base import SequentialRecommender
from models.ids import N_SPECIAL, PAD
from models.layers import causal_mask, padding_mask


class PreflightError(RuntimeError):
    pass


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise PreflightError(f"pre-flight check failed: {message}")


def preflight(model: SequentialRecommender, batch: torch.Tensor, vocab_size: int) -> None:
    """Run on a real training batch (B, L) in eval mode; restores the model's mode."""
    was_training = model.training
    model.eval()
    try:
        seq = batch[:4, : model.max_history].clone()
        seq = seq[(seq != PAD).any(1)]
        _require(len(seq) > 0, "the first batch holds no non-empty sequence")
        with torch.no_grad():
            pm = padding_mask(seq)
            _require(pm.dtype == torch.bool and pm.shape == seq.shape, "padding mask must be bool (B, L)")
            cm = causal_mask(5)
            _require(cm.dtype == torch.bool and bool(cm[0, 1]) and not bool(cm[1, 0]),
                     "causal mask must hide later positions only")
            scores = model.scores(seq)
            _require(scores.shape == (len(seq), vocab_size),
                     f"scores shape {tuple(scores.shape)} != {(len(seq), vocab_size)}")
            _require(bool(torch.isinf(scores[:, :N_SPECIAL]).all()), "padding/unknown must score -inf")
            _require(bool(torch.isfinite(scores[:, N_SPECIAL:]).all()), "item scores must be finite")
            h = model(seq)
            _require(h.dim() == 3 and h.shape[:2] == seq.shape, f"hidden shape {tuple(h.shape)} is not (B, L, D)")
            # Extra padding must not change any non-padded output.
            padded = torch.cat([seq, torch.zeros_like(seq[:, :3])], 1)[:, : model.max_history]
            h2 = model(padded)[:, : seq.size(1)]
            valid = ~pm
            _require(torch.allclose(h[valid], h2[valid], atol=1e-5), "padding changes non-padded outputs")
            if getattr(type(model), "causal", False):
                # Changing the last valid item must leave every earlier position untouched.
                lengths = valid.sum(1)
                row = int(lengths.argmax())
                n = int(lengths[row])
                if n >= 2:
                    changed = seq[row : row + 1].clone()
                    changed[0, n - 1] = N_SPECIAL + (int(changed[0, n - 1]) - N_SPECIAL + 1) % (vocab_size - N_SPECIAL)
                    h3 = model(changed)
                    _require(torch.allclose(h[row, : n - 1], h3[0, : n - 1], atol=1e-5),
                             "the causal mask lets a position see the future")
    finally:
        model.train(was_training)
