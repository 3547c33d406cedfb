"""MHSA next-location model (the seed's multi-head self-attention), with an optional copy head."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.features import N_DURATION_BINS, N_HOURS, N_QUARTERS, N_WEEKDAYS
from models.ids import PAD
from models.layers import EncoderStack, causal_attention_mask, gather_last, init_weights, sinusoidal_encoding
from models.staypoints import StayBatch


@dataclass
class MHSAConfig:
    n_locations: int  # location vocabulary, padding (0) and unknown/new place (1) included
    n_users: int  # user vocabulary, specials included; index 0 contributes nothing
    d_model: int = 32
    n_heads: int = 8
    d_ff: int = 128
    n_layers: int = 2
    dropout: float = 0.2
    max_len: int = 512  # longest history the positional table covers
    # Copy head: mix the softmax over all locations with attention over the history's own
    # locations, gated per query (a pointer-generator). False = the plain seed model.
    pointer: bool = False


class MHSA(nn.Module):
    pos: torch.Tensor  # (max_len, D) sinusoidal table, a non-persistent buffer

    def __init__(self, config: MHSAConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.loc_emb = nn.Embedding(config.n_locations, d, padding_idx=PAD)
        self.hour_emb = nn.Embedding(N_HOURS, d)
        self.quarter_emb = nn.Embedding(N_QUARTERS, d)
        self.weekday_emb = nn.Embedding(N_WEEKDAYS, d)
        self.duration_emb = nn.Embedding(N_DURATION_BINS, d)
        self.register_buffer("pos", sinusoidal_encoding(config.max_len, d), persistent=False)
        self.dropout = nn.Dropout(config.dropout)
        # Post-norm with a final LayerNorm, as the MHSA reference implementation.
        self.encoder = EncoderStack(
            config.n_layers, d, config.n_heads, config.d_ff, config.dropout, norm_first=False, final_norm=True
        )
        self.user_emb = nn.Embedding(config.n_users, d, padding_idx=PAD)
        self.head_drop = nn.Dropout(config.dropout)
        self.head_ff = nn.Sequential(nn.Linear(d, d * 2), nn.GELU(), nn.Dropout(config.dropout), nn.Linear(d * 2, d))
        self.head_norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, config.n_locations)
        if config.pointer:
            self.copy_query = nn.Linear(d, d)
            self.copy_key = nn.Linear(d, d)
            self.copy_gate = nn.Linear(2 * d, 1)
        self.apply(init_weights)
        self.encoder.init_as_torch()

    def encode(self, b: StayBatch) -> torch.Tensor:
        """-> hidden states (B, L, D) under causal and padding masks."""
        length = b.loc.size(1)
        # A trace (models/traced.py) keeps no Python check; collate_staypoints clips to max_len first.
        if not torch.jit.is_tracing() and length > self.config.max_len:
            raise ValueError(f"history of {length} staypoints exceeds max_len {self.config.max_len}")
        temporal = self.hour_emb(b.hour) + self.quarter_emb(b.quarter) + self.weekday_emb(b.weekday)
        x = (self.loc_emb(b.loc) + temporal + self.duration_emb(b.duration)) * math.sqrt(self.config.d_model)
        x = self.dropout(x + self.pos[:length][None])  # (B, L, D)
        pad = b.loc == PAD
        pad = pad & ~pad.all(1, keepdim=True)
        hidden = pad[:, None, None, :] | causal_attention_mask(length, b.loc.device)  # (B, 1, L, L) True = hidden
        return self.encoder(x, hidden)  # (B, L, D)

    def forward(self, b: StayBatch) -> torch.Tensor:
        """-> log-probabilities over all locations (B, V); padding is -inf."""
        h = self.encode(b)  # (B, L, D)
        last = gather_last(h, b.loc)  # (B, D)
        z = self.head_drop(last + self.user_emb(b.user))
        z = self.head_norm(z + self.head_ff(z))  # (B, D)
        logits = self.out(z)  # (B, V)
        logits[:, PAD] = float("-inf")
        if not self.config.pointer:
            return F.log_softmax(logits, dim=1)
        att = (self.copy_query(z)[:, None, :] * self.copy_key(h)).sum(-1) / math.sqrt(self.config.d_model)  # (B, L)
        att = F.softmax(att.masked_fill(b.loc == PAD, float("-inf")), dim=1)
        copy = torch.zeros_like(logits).scatter_add(1, b.loc, att)  # (B, V): attention summed per location
        gate = torch.sigmoid(self.copy_gate(torch.cat([z, last], 1)))  # (B, 1): share given to generating
        p = gate * F.softmax(logits, dim=1) + (1 - gate) * copy
        logp = torch.log(p.clamp(min=1e-12))
        logp[:, PAD] = float("-inf")
        return logp

    def scores(self, b: StayBatch) -> torch.Tensor:
        """(B, V) log-probabilities; the unknown class (1) stands for "a place not seen in training"."""
        return self(b)

    def loss(self, b: StayBatch) -> torch.Tensor:
        if b.target is None:
            raise ValueError("the batch has no targets")
        return F.nll_loss(self(b), b.target, ignore_index=PAD)
