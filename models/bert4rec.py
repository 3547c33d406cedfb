"""BERT4Rec: a bidirectional transformer trained with the cloze objective."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.base import DotForm, RecommenderConfig, SequentialRecommender
from models.ids import N_SPECIAL, PAD
from models.layers import (
    LENGTH_GROUPS,
    NegativeSampler,
    SequenceEncoder,
    init_weights,
    length_groups,
    shared_negatives_loss,
)


@dataclass
class BERT4RecConfig(RecommenderConfig):
    """The [MASK] token is index vocab_size. n_negatives = 0: softmax over all items at the masked positions."""

    n_negatives: int = 0
    mask_prob: float = 0.15
    # Share of training rows where only the last item is masked: the inference task itself
    # (the BERT4Rec paper adds such samples too).
    last_item_prob: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError("mask_prob must be in (0, 1)")


def cloze(
    seq: torch.Tensor, mask_prob: float, mask_token: int, vocab_size: int, last_item_prob: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cloze corruption. seq: (B, L) -> (inputs (B, L), labels (B, L) with 0 where no loss).

    Each valid position is chosen with `mask_prob`; a chosen one becomes [MASK] 80% of the time,
    a random item 10%, stays 10%. A row that drew no position gets its last item chosen, and a
    `last_item_prob` share of rows mask exactly their last item.
    """
    valid = seq != PAD
    chosen = (torch.rand(seq.shape, device=seq.device) < mask_prob) & valid
    lengths = valid.sum(1)
    last = (lengths - 1).clamp(min=0)
    rows = torch.arange(seq.size(0), device=seq.device)
    last_only = (torch.rand(seq.size(0), device=seq.device) < last_item_prob) & (lengths > 0)
    need_one = (~chosen.any(1) | last_only) & (lengths > 0)
    chosen[last_only] = False
    chosen[rows[need_one], last[need_one]] = True
    labels = torch.where(chosen, seq, torch.zeros_like(seq))
    r = torch.rand(seq.shape, device=seq.device)
    inputs = seq.clone()
    to_mask = chosen & (r < 0.8)
    to_rand = chosen & (r >= 0.8) & (r < 0.9)
    inputs[to_mask] = mask_token
    inputs[to_rand] = torch.randint(N_SPECIAL, vocab_size, (int(to_rand.sum()),), device=seq.device)
    # The last-item rows are the inference task: always a real [MASK] there.
    inputs[rows[last_only], last[last_only]] = mask_token
    return inputs, labels


class BERT4Rec(SequentialRecommender):
    causal = False

    def __init__(self, config: BERT4RecConfig) -> None:
        super().__init__()
        self.config = config
        self.mask_token = config.vocab_size
        self.encoder = SequenceEncoder.from_config(config, vocab_size=config.vocab_size + 1, causal=self.causal)
        self.transform = nn.Sequential(
            nn.Linear(config.d_model, config.d_model), nn.GELU(), nn.LayerNorm(config.d_model)
        )
        self.out_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.sampler = NegativeSampler(
            config.vocab_size, max(config.n_negatives, 1), config.negative_pop_share, config.logq_correction
        )
        self.transform.apply(init_weights)
        self._add_transition_table()

    @property
    def max_history(self) -> int:
        return self.config.max_len - 1  # room for the appended [MASK]

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        """seq: (B, L) right-padded indices, [MASK] allowed -> hidden (B, L, D)."""
        return self.encoder(seq)

    def dot_form(self) -> DotForm:
        table = self.encoder.token_emb.weight[: self.config.vocab_size]
        return DotForm(table, self.out_bias, self.prior_entries if self.uses_prior else None)

    def scores(self, seq: torch.Tensor) -> torch.Tensor:
        """Next-item scores: append [MASK] after each history and read it. (B, L) -> (B, V)."""
        w = self.encoder.token_emb.weight[: self.config.vocab_size]
        s = self.add_prior(self.query(seq) @ w.T + self.out_bias, seq)  # (B, V)
        s[:, :N_SPECIAL] = float("-inf")  # padding, unknown (and [MASK] is not in the output)
        return s

    def query(self, seq: torch.Tensor) -> torch.Tensor:
        """The transformed hidden state at a [MASK] appended to each history. (B, L) -> (B, D)."""
        lengths = (seq != PAD).sum(1)  # (B,)
        # A trace (models/traced.py) keeps no Python check; pack_histories clips to max_history first.
        if not torch.jit.is_tracing() and int(lengths.max()) >= self.config.max_len:
            raise ValueError(f"history longer than {self.max_history} items")
        x = torch.cat([seq, torch.zeros_like(seq[:, :1])], dim=1)  # (B, L+1)
        rows = torch.arange(seq.size(0), device=seq.device)
        x[rows, lengths] = self.mask_token
        return self.transform(self.encoder.read(x, lengths))  # (B, D)

    def loss(self, seq: torch.Tensor) -> torch.Tensor:
        """Cloze loss on the chosen positions only. seq: (B, L) right-padded training windows."""
        cfg = self.config
        inputs, labels = cloze(seq, cfg.mask_prob, self.mask_token, cfg.vocab_size, cfg.last_item_prob)
        groups = length_groups((seq != PAD).sum(1), LENGTH_GROUPS)  # the batch's rows, less padding
        parts = [(inputs[rows, :n], labels[rows, :n]) for rows, n in groups]
        h = torch.cat([self(x)[y != PAD] for x, y in parts])  # (N, D)
        target = torch.cat([y[y != PAD] for _, y in parts])  # (N,)
        if cfg.n_negatives == 0:
            # The specials are not classes: left out of the logits (label smoothing spreads over items).
            w = self.encoder.token_emb.weight[N_SPECIAL : cfg.vocab_size]
            logits = self.transform(h) @ w.T + self.out_bias[N_SPECIAL:]  # (N, V - N_SPECIAL)
            return F.cross_entropy(logits, target - N_SPECIAL, label_smoothing=cfg.label_smoothing)
        w = self.encoder.token_emb.weight
        neg, correction = self.sampler(seq.device)
        t = self.transform(h)
        pos_logit = (t * w[target]).sum(-1) + self.out_bias[target]  # (N,)
        neg_logit = torch.addmm(self.out_bias[neg] - correction, t, w[neg].T)  # (N, K)
        return shared_negatives_loss(pos_logit, neg_logit, target, neg, smoothing=cfg.label_smoothing)
