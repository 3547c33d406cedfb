"""An encoder-decoder transformer (the copy task's model): attention, masks, positions and greedy
decoding built from the same pieces the other models use (models/layers.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.ids import PAD
from models.layers import (
    Attention,
    EncoderLayer,
    FeedForward,
    decoder_mask,
    init_weights,
    key_padding_mask,
    sinusoidal_encoding,
)

BOS, EOS = 1, 2  # with PAD = 0: the specials of a token vocabulary
FIRST_TOKEN = 3
POSITIONS = ("sinusoidal", "learned")


@dataclass
class Seq2SeqConfig:
    vocab_size: int = 32  # PAD, BOS, EOS and the symbols 3..vocab_size - 1
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2  # encoder layers, and as many decoder layers
    d_ff: int = 256
    dropout: float = 0.1
    max_len: int = 64  # longest sequence the position table covers (tokens + EOS)
    positions: str = "sinusoidal"  # or "learned"

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.vocab_size <= FIRST_TOKEN:
            raise ValueError("vocab_size must leave room for at least one symbol")


@dataclass
class Seq2SeqBatch:
    """Right-padded token sequences, batch first."""

    src: torch.Tensor  # (B, S) tokens + EOS
    tgt_in: torch.Tensor  # (B, T) BOS + tokens
    tgt_out: torch.Tensor  # (B, T) tokens + EOS

    def __len__(self) -> int:
        return int(self.src.size(0))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Seq2SeqBatch:
        return Seq2SeqBatch(*(t.to(device, non_blocking=non_blocking) for t in (self.src, self.tgt_in, self.tgt_out)))


class DecoderLayer(nn.Module):
    """Pre-norm: masked self-attention, cross-attention over the encoder's output, feed-forward."""

    def __init__(self, d: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.self_attn, self.cross_attn = Attention(d, n_heads, dropout), Attention(d, n_heads, dropout)
        self.ff = FeedForward(d, d_ff, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        y: torch.Tensor,
        memory: torch.Tensor,
        self_mask: torch.Tensor,
        memory_mask: torch.Tensor,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        h = self.norm1(y)
        a, ws = self.self_attn(h, h, self_mask, need_weights=need_weights)
        y = y + self.drop(a)
        c, wc = self.cross_attn(self.norm2(y), memory, memory_mask, need_weights=need_weights)
        y = y + self.drop(c)
        return y + self.drop(self.ff(self.norm3(y))), ws, wc


@dataclass
class Attentions:
    """One map per layer: encoder self-attention (B, H, S, S); decoder self (B, H, T, T) and cross (B, H, T, S)."""

    encoder: list[torch.Tensor]
    decoder_self: list[torch.Tensor]
    decoder_cross: list[torch.Tensor]


class Seq2Seq(nn.Module):
    pos_table: torch.Tensor  # (max_len, D) sinusoidal positions, a non-persistent buffer

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=PAD)
        self.learned_pos = nn.Embedding(c.max_len, c.d_model) if c.positions == "learned" else None
        self.register_buffer("pos_table", sinusoidal_encoding(c.max_len, c.d_model), persistent=False)
        self.encoder = nn.ModuleList(EncoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout) for _ in range(c.n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout) for _ in range(c.n_layers))
        self.enc_norm, self.dec_norm = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.apply(init_weights)
        # Scaled by sqrt(d) in _embed: unit-size token vectors beside unit-size positions. At the 0.02 of
        # init_weights the positions drown the tokens and training sits at chance for several epochs.
        nn.init.normal_(self.embed.weight, 0.0, c.d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[PAD].zero_()

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, L) -> (B, L, D): scaled token embedding plus positions."""
        length = tokens.size(1)
        if length > self.config.max_len:
            raise ValueError(f"sequence of {length} exceeds max_len {self.config.max_len}")
        pos = self.pos_table[:length] if self.learned_pos is None else self.learned_pos.weight[:length]
        return self.drop(self.embed(tokens) * math.sqrt(self.config.d_model) + pos[None])

    def encode(
        self, src: torch.Tensor, src_pad: torch.Tensor | None = None, need_weights: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """src: (B, S) -> memory (B, S, D) and the encoder's attention maps (if asked).

        src_pad: the (B, 1, 1, S) padding mask; by default the PAD positions of `src`.
        """
        x, mask = self._embed(src), key_padding_mask(src) if src_pad is None else src_pad
        maps = []
        for layer in self.encoder:
            x, w = layer(x, mask, need_weights)
            if w is not None:
                maps.append(w)
        return self.enc_norm(x), maps

    def decode(
        self, tgt_in: torch.Tensor, memory: torch.Tensor, src_pad: torch.Tensor, need_weights: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """tgt_in: (B, T), memory (B, S, D), src_pad (B, 1, 1, S) -> logits (B, T, V); the decoder's self
        and cross maps (if asked)."""
        y, self_mask, memory_mask = self._embed(tgt_in), decoder_mask(tgt_in), src_pad
        self_maps, cross_maps = [], []
        for layer in self.decoder:
            y, ws, wc = layer(y, memory, self_mask, memory_mask, need_weights)
            if ws is not None and wc is not None:
                self_maps.append(ws)
                cross_maps.append(wc)
        return self.dec_norm(y) @ self.embed.weight.T, self_maps, cross_maps  # output tied to the input embedding

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, src_pad: torch.Tensor | None = None) -> torch.Tensor:
        """src: (B, S), tgt_in: (B, T) right-padded token ids -> logits (B, T, V)."""
        pad = key_padding_mask(src) if src_pad is None else src_pad
        memory, _ = self.encode(src, pad)
        return self.decode(tgt_in, memory, pad)[0]

    def attention_maps(self, src: torch.Tensor, tgt_in: torch.Tensor) -> tuple[torch.Tensor, Attentions]:
        """forward() and every attention map, one per layer."""
        pad = key_padding_mask(src)
        memory, enc = self.encode(src, pad, need_weights=True)
        logits, dec_self, dec_cross = self.decode(tgt_in, memory, pad, need_weights=True)
        return logits, Attentions(enc, dec_self, dec_cross)

    def loss(self, batch: Seq2SeqBatch) -> torch.Tensor:
        """Cross-entropy over the target's non-padding tokens."""
        logits = self(batch.src, batch.tgt_in)  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD)

    @torch.no_grad()
    def greedy(self, src: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
        """Batched greedy decoding. src: (B, S) -> (B, <= max_len) tokens, each row stopping at its EOS
        (PAD after it); all rows stop at `max_len` (default: the position table's length)."""
        limit = min(max_len or self.config.max_len, self.config.max_len)
        pad = key_padding_mask(src)
        memory, _ = self.encode(src, pad)
        out = torch.full((src.size(0), 1), BOS, dtype=torch.long, device=src.device)
        done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
        for _ in range(limit):
            logits = self.decode(out, memory, pad)[0][:, -1]  # (B, V)
            logits[:, PAD] = float("-inf")
            logits[:, BOS] = float("-inf")
            nxt = logits.argmax(-1).masked_fill(done, PAD)
            out = torch.cat([out, nxt[:, None]], 1)
            done |= nxt == EOS
            if bool(done.all()):
                break
        return out[:, 1:]
