"""The social-interaction model: whom a user will interact with next, from their (action, target user)
history. Each step is concat(action embedding, target-user embedding); a transformer encoder with a
padding mask; the history pooled (mean over valid steps, or the last step); scores over every user.

With `activity` windows, each candidate's interactions received and made in those windows before the
query (models/activity.py) add sum_f w_f * log(1 + count_f) (w per user with `activity_by_user`, plus
an MLP of the log-counts with `activity_hidden`) to its log-probability, renormalised: who is being
interacted with right now, which no single history shows (docs/decisions/recent-activity.md).

Histories are LEFT-padded here (the newest step at the last position), in training and serving alike
(`pack_steps`), so that "last" and positions counted back from the query need no gather.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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


# Adam moves a weight by about the learning rate per step: one epoch of 800 steps at 2e-3 would cap
# these few weights near 1.6, while the coefficients a search on validation picks reach 4
# (docs/decisions/recent-activity.md). The scale is their learning-rate multiplier.
ACTIVITY_SCALE = 10.0


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
    # Seconds before the query: each candidate's interactions received and made in each window, an input
    # with learned weights (empty: none; the batch then carries no activity).
    activity: list[float] = field(default_factory=list)
    # > 0: also each candidate's interactions in those windows with the targets of the history's newest
    # this many steps (the threads the user is in now).
    activity_contacts: int = 0
    activity_per_action: bool = False  # also received and made per action the log holds
    n_own_actions: int = 0  # the log's own actions: the action indices after PAD and UNK (set by the job)
    activity_by_user: bool = False  # the weights also depend on the user's pooled history (a linear map)
    activity_hidden: int = 0  # > 0: plus an MLP of this width over the counts and the user's state

    def __post_init__(self) -> None:
        if self.pooling not in POOLING:
            raise ValueError(f"pooling must be one of {POOLING}, got {self.pooling!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if (2 * self.emb_dim) % self.n_heads:
            raise ValueError("2 * emb_dim must be a multiple of n_heads")
        if any(not (isinstance(w, int | float) and 0 < w < math.inf) for w in self.activity):
            raise ValueError(f"activity windows must be positive seconds, got {self.activity}")
        if not 0 <= self.n_own_actions <= max(0, self.n_actions - N_SPECIAL):
            raise ValueError(f"n_own_actions must be in [0, {self.n_actions - N_SPECIAL}], got {self.n_own_actions}")
        if self.activity_contacts < 0:
            raise ValueError(f"activity_contacts must be >= 0, got {self.activity_contacts}")

    @property
    def n_activity(self) -> int:
        """Activity features per candidate, per window: received, made, with the contacts, and
        received and made per own action (those asked for)."""
        per_action = 2 * self.n_own_actions if self.activity_per_action else 0
        return (2 + (self.activity_contacts > 0) + per_action) * len(self.activity)

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
    # Sparse recent activity (models/activity.py): the query and user of each entry, and its counts.
    activity_index: torch.Tensor | None = None  # (2, N) long
    activity_counts: torch.Tensor | None = None  # (N, F) float

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
            move(self.activity_index),
            move(self.activity_counts),
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
        # Zero: a model starts as one without the input. Scaled by ACTIVITY_SCALE in use (see there).
        self.activity_weight = nn.Parameter(torch.zeros(c.n_activity)) if c.n_activity else None
        self.activity_user = nn.Linear(d, c.n_activity) if c.n_activity and c.activity_by_user else None
        if self.activity_user is not None:
            nn.init.zeros_(self.activity_user.weight)
            nn.init.zeros_(self.activity_user.bias)
        h = c.activity_hidden if c.n_activity else 0
        self.activity_in = nn.Linear(c.n_activity, h) if h else None
        self.activity_in_user = nn.Linear(d, h, bias=False) if h else None
        self.activity_out = nn.Linear(h, 1) if h else None
        if self.activity_out is not None:
            nn.init.zeros_(self.activity_out.weight)
            nn.init.zeros_(self.activity_out.bias)

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
        logits, z, att, gate = self._parts(b)
        return self._log_probs(b, logits, z, att, gate)

    def _log_probs(
        self,
        b: SocialBatch,
        logits: torch.Tensor,
        z: torch.Tensor,
        att: torch.Tensor | None,
        gate: torch.Tensor | None,
    ) -> torch.Tensor:
        if att is None or gate is None:
            out = F.log_softmax(logits, -1)
        else:
            copy = torch.zeros_like(logits).scatter_add(1, b.targets, att)  # (B, V): attention summed per user
            out = torch.log((gate * F.softmax(logits, -1) + (1 - gate) * copy).clamp(min=1e-12))
            out[:, :N_SPECIAL] = float("-inf")
        if self.activity_weight is None:
            return out
        if b.activity_index is None or b.activity_counts is None:
            raise ValueError("this model takes recent activity: the batch has none")
        w = self.activity_weight[None, :]  # (1, F)
        if self.activity_user is not None:  # each user's own weights: (N, F) from the pooled state
            w = w + self.activity_user(z)[b.activity_index[0]]
        x = torch.log1p(b.activity_counts).to(self.activity_weight.dtype)  # (N, F); half weights on a GPU
        bonus = (x * (ACTIVITY_SCALE * w)).sum(-1)  # (N,)
        if self.activity_in is not None and self.activity_in_user is not None and self.activity_out is not None:
            hidden = F.relu(self.activity_in(x) + self.activity_in_user(z)[b.activity_index[0]])  # (N, H)
            bonus = bonus + self.activity_out(hidden).squeeze(-1)
        out = out.index_put((b.activity_index[0], b.activity_index[1]), bonus.to(out.dtype), accumulate=True)
        return F.log_softmax(out, -1)

    def scores(self, b: SocialBatch) -> torch.Tensor:
        """(B, V) scores over users (log-probabilities); PAD and UNK at -inf."""
        return self(b)

    def loss(self, b: SocialBatch) -> torch.Tensor:
        """Negative log-likelihood of the next target (plus the next action's, weighted, if asked).
        Without recent activity only the target's probability is formed: one logsumexp over the users,
        no (B, V) mixture; with it the mixture is renormalised over every user."""
        assert b.next_target is not None
        t = b.next_target[:, None]
        logits, z, att, gate = self._parts(b)
        if self.activity_weight is not None:
            loss = -self._log_probs(b, logits, z, att, gate).gather(1, t).mean()
        else:
            loss = self._target_nll(b, logits, att, gate)
        if self.action_out is not None and b.next_action is not None:
            loss = loss + self.config.action_weight * F.cross_entropy(self.action_out(z), b.next_action)
        return loss

    def _target_nll(
        self, b: SocialBatch, logits: torch.Tensor, att: torch.Tensor | None, gate: torch.Tensor | None
    ) -> torch.Tensor:
        assert b.next_target is not None
        t = b.next_target[:, None]
        log_gen = logits.gather(1, t).squeeze(1) - torch.logsumexp(logits, -1)  # (B,)
        if att is None or gate is None:
            loss = -log_gen.mean()
        else:
            copied = (att * (b.targets == t)).sum(1)  # (B,) attention on the steps whose target it is
            g = gate.squeeze(1)
            loss = -torch.log((g * log_gen.exp() + (1 - g) * copied).clamp(min=1e-12)).mean()
        return loss
