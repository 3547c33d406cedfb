"""Filters along the positions of a sequence, beside or instead of attention in the encoder layer
(docs/decisions/sequence-filters.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.base import FILTER_KINDS


@dataclass(frozen=True)
class FilterSpec:
    """A filter along the positions beside attention (docs/decisions/sequence-filters.md).

    kind: "bsa", BSARec's (AAAI'24) fixed low-pass with the high frequencies rescaled by a learned
    per-channel beta; "learned", FMLP-Rec's (WWW'22) learnable per-channel filter; "tv", TV-Rec's
    (NeurIPS'25) time-variant filter: each position its own taps, a combination of `bases` learned
    per-channel filters with learned per-position coefficients. `mix`: the filter's share of the token
    mixing (BSARec's alpha; 1 = the filter alone, as FMLP-Rec and TV-Rec). `cutoff`: BSARec's c (the
    low-pass keeps the first c // 2 + 1 frequencies of a `max_len` frame). A causal filter gives each
    position what the filter gives the last position of the `max_len` frame ending there (zeros before
    the start): what BSARec and FMLP-Rec compute at the one position they predict from. A causal "tv"
    filter gives position t its own taps over t and what precedes it (t counted from the sequence's
    start, as the position embeddings count).
    """

    kind: str
    mix: float
    cutoff: int
    max_len: int
    causal: bool
    bases: int = 32


def low_pass_matrix(length: int, cutoff: int) -> torch.Tensor:
    """BSARec's low-pass over a frame of `length` positions as an (L, L) matrix P (low = P @ x):
    rfft, the first cutoff // 2 + 1 frequencies kept, irfft. P is circulant."""
    spec = torch.fft.rfft(torch.eye(length, dtype=torch.float64), dim=0, norm="ortho")
    spec[cutoff // 2 + 1 :] = 0
    return torch.fft.irfft(spec, n=length, dim=0, norm="ortho").float()


class SequenceFilter(nn.Module):
    """Each channel mixed along the positions by an (L, L) filter of offsets t - s (FilterSpec)."""

    index: torch.Tensor  # (L, L) long: which kernel entry each (t, s) reads
    valid: torch.Tensor  # (L, L) 0/1: whether s reaches t at all
    kernel: torch.Tensor  # (L,) fixed ("bsa") or (L, D) learned, by offset; "tv" has coefficients and bases

    def __init__(self, spec: FilterSpec, d: int) -> None:
        super().__init__()
        if spec.kind not in FILTER_KINDS[1:]:
            raise ValueError(f"filter kind must be one of {FILTER_KINDS[1:]}, got {spec.kind!r}")
        self.kind = spec.kind
        n = spec.max_len
        offsets = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # (L, L): t - s
        # Causal: offsets 0..L-1 back, none forward; bidirectional: circular, as the FFT's frame.
        self.register_buffer("index", offsets.clamp(min=0) if spec.causal else offsets % n, persistent=False)
        self.register_buffer(
            "valid", (offsets >= 0 if spec.causal else torch.ones(n, n, dtype=torch.bool)).float(), persistent=False
        )
        if spec.kind == "bsa":
            # By offset: the circulant's first column. Derived from the spec, so not stored.
            self.register_buffer("kernel", low_pass_matrix(n, spec.cutoff)[:, 0].contiguous(), persistent=False)
            self.sqrt_beta = nn.Parameter(torch.randn(d))  # BSARec's initialisation
        elif spec.kind == "learned":
            self.kernel = nn.Parameter(torch.randn(n, d) * 0.02)  # (L, D), FMLP-Rec's scale
        else:
            if spec.bases < 1:
                raise ValueError(f"a time-variant filter needs at least one basis, got {spec.bases}")
            # Position t's taps = coefficients[t] @ bases: at initialisation each row a random combination
            # of the bases with the learned filter's scale.
            self.coefficients = nn.Parameter(torch.randn(n, spec.bases) / spec.bases**0.5)  # (L, M)
            self.bases = nn.Parameter(torch.randn(spec.bases, n, d) * 0.02)  # (M, L, D): taps by offset

    def _matrix(self, length: int) -> torch.Tensor:
        """(l, l) for "bsa", (l, l, D) for "learned" and "tv": the filter over the first l positions."""
        index, valid = self.index[:length, :length], self.valid[:length, :length]
        if self.kind == "tv":
            taps = torch.einsum("tm,mkd->tkd", self.coefficients[:length], self.bases)  # (l, L, D): t's tap by offset
            k = taps.gather(1, index[..., None].expand(-1, -1, taps.size(-1)))  # (l, l, D)
        else:
            k = self.kernel[index]
        return k * (valid if k.dim() == 2 else valid[..., None])

    def forward(self, h: torch.Tensor, keep: torch.Tensor | None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """h: (B, L, D); keep: (B, L) bool, the positions that may contribute (None = all); rows: (B,),
        one output position per row -> (B, 1, D), else -> (B, L, D)."""
        m = self._matrix(h.size(1))  # (L, L[, D])
        src = h if keep is None else h * keep[..., None]
        if rows is not None:
            m = m[rows]  # (B, L[, D])
            mixed = (m[..., None] * src if m.dim() == 2 else m * src).sum(1, keepdim=True)  # (B, 1, D)
            here = h[torch.arange(h.size(0), device=h.device), rows][:, None]  # (B, 1, D)
        else:
            mixed = m @ src if m.dim() == 2 else torch.einsum("tsd,bsd->btd", m, src)  # (B, L, D)
            here = h
        if self.kind != "bsa":
            return mixed
        return mixed + self.sqrt_beta**2 * (here - mixed)  # low + beta^2 * high
