"""The social-interaction model: whom a user will interact with next, from their (action, target user)
history. Each step is concat(action embedding, target-user embedding); a transformer encoder with a
padding mask; the history pooled (mean over valid steps, or the last step); scores over every user.

Histories are LEFT-padded here (the newest step at the last position), in training and serving alike
(`pack_steps`), so that "last" and positions counted back from the query need no gather.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.ids import N_SPECIAL, PAD
from models.layers import EncoderLayer, init_weights, rope_tables

POOLING = ("mean", "last")
POSITIONS = ("none", "learned", "rope", "time")
# A step another user performed on the history's owner carries its action under this prefix
# ("<-a2q": someone answered the owner's question); training and serving build such steps alike.
INCOMING = "<-"


def incoming(action: str) -> str:
    """The action as seen by the user it was performed on."""
    return INCOMING + action


def is_incoming(action: str | None) -> bool:
    return action is not None and action.startswith(INCOMING)


def time_buckets(seconds: torch.Tensor, n_buckets: int) -> torch.Tensor:
    """Time between a step and the query on a log scale: 1 + floor(2 * log2(1 + minutes)), capped at
    n_buckets - 1; 0 is padding. Half-octave buckets: a minute, ..., a day is 21, a year 38."""
    minutes = seconds.float().clamp(min=0.0) / 60.0
    b = (2.0 * torch.log2(1.0 + minutes)).floor().long() + 1
    return b.clamp(1, n_buckets - 1)


@dataclass
class SocialConfig:
    n_users: int = 100  # user vocabulary, PAD and UNK included
    n_actions: int = 5  # action vocabulary, PAD and UNK included
    emb_dim: int = 32  # per half of a step: d_model = 2 * emb_dim
    n_heads: int = 2
    n_layers: int = 2
    d_ff: int = 256
    dropout: float = 0.1
    max_history: int = 50
    pooling: str = "mean"  # or "last"
    positions: str = "none"  # none | learned (counted back from the query) | rope | time (to the query)
    n_time_buckets: int = 48
    copy_head: bool = True  # a pointer over the history's targets, mixed with the generator by a gate
    action_head: bool = False  # also predict the next action (an auxiliary loss)
    action_weight: float = 0.2

    def __post_init__(self) -> None:
        if self.pooling not in POOLING:
            raise ValueError(f"pooling must be one of {POOLING}, got {self.pooling!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if (2 * self.emb_dim) % self.n_heads:
            raise ValueError("2 * emb_dim must be a multiple of n_heads")

    @property
    def d_model(self) -> int:
        return 2 * self.emb_dim


@dataclass
class SocialBatch:
    """Left-padded histories (newest step last) and, for training, the next step."""

    targets: torch.Tensor  # (B, L) user indices, PAD = 0
    actions: torch.Tensor  # (B, L) action indices
    ago: torch.Tensor  # (B, L) time buckets between each step and the query (0 = padding)
    next_target: torch.Tensor | None = None  # (B,)
    next_action: torch.Tensor | None = None  # (B,)

    def __len__(self) -> int:
        return int(self.targets.size(0))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SocialBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return SocialBatch(
            self.targets.to(device, non_blocking=non_blocking),
            self.actions.to(device, non_blocking=non_blocking),
            self.ago.to(device, non_blocking=non_blocking),
            move(self.next_target),
            move(self.next_action),
        )


def pack_steps(
    rows: list[list[tuple[int, int, float]]], *, query_times: list[float], max_history: int, n_buckets: int
) -> SocialBatch:
    """Per query its steps (target index, action index, unix time; oldest first) -> a left-padded batch
    of the newest `max_history`; `ago` from each query's time. A query with no step gets one UNK step."""
    width = max(1, *(min(len(r), max_history) for r in rows)) if rows else 1
    b = len(rows)
    targets = torch.zeros(b, width, dtype=torch.long)
    actions = torch.zeros(b, width, dtype=torch.long)
    when = torch.zeros(b, width, dtype=torch.float64)
    for i, r in enumerate(rows):
        r = r[-max_history:] or [(1, 1, query_times[i])]
        n = len(r)
        targets[i, width - n :] = torch.tensor([s[0] for s in r], dtype=torch.long)
        actions[i, width - n :] = torch.tensor([s[1] for s in r], dtype=torch.long)
        when[i, width - n :] = torch.tensor([s[2] for s in r], dtype=torch.float64)
    q = torch.tensor(query_times, dtype=torch.float64)[:, None]
    ago = time_buckets(q - when, n_buckets).masked_fill(targets == PAD, 0)
    return SocialBatch(targets, actions, ago)


class SocialModel(nn.Module):
    def __init__(self, config: SocialConfig) -> None:
        super().__init__()
        self.config = c = config
        d = c.d_model
        self.user_emb = nn.Embedding(c.n_users, c.emb_dim, padding_idx=PAD)
        self.action_emb = nn.Embedding(c.n_actions, c.emb_dim, padding_idx=PAD)
        self.pos_emb = nn.Embedding(c.max_history, d) if c.positions == "learned" else None
        self.time_emb = nn.Embedding(c.n_time_buckets, d, padding_idx=0) if c.positions == "time" else None
        self.layers = nn.ModuleList(EncoderLayer(d, c.n_heads, c.d_ff, c.dropout) for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(d)
        self.drop = nn.Dropout(c.dropout)
        self.out = nn.Linear(d, c.emb_dim)  # into the target-embedding space (tied output)
        self.user_bias = nn.Parameter(torch.zeros(c.n_users))
        if c.copy_head:
            self.copy_query, self.copy_key = nn.Linear(d, d), nn.Linear(d, d)
            self.copy_gate = nn.Linear(2 * d, 1)
        self.action_out = nn.Linear(d, c.n_actions) if c.action_head else None
        self.apply(init_weights)

    def encode(self, b: SocialBatch) -> torch.Tensor:
        """-> per-step states (B, L, D)."""
        x = torch.cat([self.action_emb(b.actions), self.user_emb(b.targets)], -1)  # (B, L, D)
        length = x.size(1)
        if self.pos_emb is not None:  # index 0 = the newest step
            back = torch.arange(length - 1, -1, -1, device=x.device).clamp(max=self.config.max_history - 1)
            x = x + self.pos_emb(back)[None]
        if self.time_emb is not None:
            x = x + self.time_emb(b.ago)
        rope = (
            rope_tables(length, self.config.d_model // self.config.n_heads, x.device)
            if self.config.positions == "rope"
            else None
        )
        mask = (b.targets == PAD)[:, None, None, :]  # (B, 1, 1, L) True = hidden
        x = self.drop(x)
        for layer in self.layers:
            x, _ = layer(x, mask, rope=rope)
        return self.norm(x)

    def pool(self, h: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """(B, L, D), valid (B, L) -> (B, D)."""
        if self.config.pooling == "last":
            return h[:, -1]
        w = valid.unsqueeze(-1).to(h.dtype)
        return (h * w).sum(1) / w.sum(1).clamp(min=1.0)

    def _parts(self, b: SocialBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """-> generator logits (B, V) with PAD/UNK at -inf, pooled state (B, D), copy attention over the
        steps (B, L) and the generator's share (B, 1) (both None without the copy head)."""
        valid = b.targets != PAD
        h = self.encode(b)
        z = self.pool(h, valid)
        logits = self.out(z) @ self.user_emb.weight.T + self.user_bias  # (B, V)
        logits[:, :N_SPECIAL] = float("-inf")
        if not self.config.copy_head:
            return logits, z, None, None
        att = (self.copy_query(z)[:, None, :] * self.copy_key(h)).sum(-1) / math.sqrt(self.config.d_model)  # (B, L)
        att = F.softmax(att.masked_fill(~valid, float("-inf")), -1)
        gate = torch.sigmoid(self.copy_gate(torch.cat([z, h[:, -1]], 1)))  # (B, 1)
        return logits, z, att, gate

    def forward(self, b: SocialBatch) -> torch.Tensor:
        """-> log-probabilities over users (B, V); PAD and UNK at -inf."""
        logits, _, att, gate = self._parts(b)
        if att is None or gate is None:
            return F.log_softmax(logits, -1)
        copy = torch.zeros_like(logits).scatter_add(1, b.targets, att)  # (B, V): attention summed per user
        out = torch.log((gate * F.softmax(logits, -1) + (1 - gate) * copy).clamp(min=1e-12))
        out[:, :N_SPECIAL] = float("-inf")
        return out

    def scores(self, b: SocialBatch) -> torch.Tensor:
        """(B, V) scores over users (log-probabilities); PAD and UNK at -inf."""
        return self(b)

    def loss(self, b: SocialBatch) -> torch.Tensor:
        """Negative log-likelihood of the next target (plus the next action's, weighted, if asked).
        Only the target's probability is formed: one logsumexp over the users, no (B, V) mixture."""
        assert b.next_target is not None
        logits, z, att, gate = self._parts(b)
        t = b.next_target[:, None]
        log_gen = logits.gather(1, t).squeeze(1) - torch.logsumexp(logits, -1)  # (B,)
        if att is None or gate is None:
            loss = -log_gen.mean()
        else:
            copied = (att * (b.targets == t)).sum(1)  # (B,) attention on the steps whose target it is
            g = gate.squeeze(1)
            loss = -torch.log((g * log_gen.exp() + (1 - g) * copied).clamp(min=1e-12)).mean()
        if self.action_out is not None and b.next_action is not None:
            loss = loss + self.config.action_weight * F.cross_entropy(self.action_out(z), b.next_action)
        return loss
