"""SASRec: a causal transformer that predicts the next item at every position."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.base import DotForm, RecommenderConfig, SequentialRecommender
from models.ids import N_SPECIAL, PAD
from models.layers import NegativeSampler, SequenceEncoder, cross_entropy, last_valid_index
from models.transitions import transition_table

LOSSES = ("auto", "sampled_softmax", "softmax", "bce")
# "auto": the full softmax while it costs at most this many times the sampled one (V logits a target
# against n_negatives + 1), else the sampled softmax; one config then fits any catalog size.
AUTO_FULL_RATIO = 4


@dataclass
class SASRecConfig(RecommenderConfig):
    # sampled_softmax: softmax over the target and `n_negatives` items shared by the batch
    # (SASRec+ / gSASRec); softmax: over all items; bce: one random negative (the original);
    # auto: softmax up to AUTO_FULL_RATIO * n_negatives items, sampled_softmax beyond.
    loss: str = "sampled_softmax"
    # A transition prior (models/transitions.py): each item's `transition_width` most frequent next
    # items, added to the scores as transition_weight * log1p(count). The training job fills the
    # table and chooses the weight on validation; 0 = no table.
    transition_width: int = 0
    transition_weight: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.transition_width < 0 or self.transition_weight < 0:
            raise ValueError("transition_width and transition_weight must be >= 0")

    @property
    def training_loss(self) -> str:
        """The loss trained with: `loss`, with "auto" resolved by the catalog's size."""
        if self.loss != "auto":
            return self.loss
        return "softmax" if self.vocab_size <= AUTO_FULL_RATIO * self.n_negatives else "sampled_softmax"


class SASRec(SequentialRecommender):
    causal = True  # the contract pre-flight checks: a position never sees later items
    successors: torch.Tensor  # (V, transition_width) int32, with a transition table
    successor_log_counts: torch.Tensor  # (V, transition_width)

    def __init__(self, config: SASRecConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = SequenceEncoder.from_config(config, vocab_size=config.vocab_size, causal=self.causal)
        self.sampler = NegativeSampler(
            config.vocab_size, config.n_negatives, config.negative_pop_share, config.logq_correction
        )
        if config.transition_width:  # only then: checkpoints from before the prior load unchanged
            shape = (config.vocab_size, config.transition_width)
            self.register_buffer("successors", torch.zeros(shape, dtype=torch.int32))
            self.register_buffer("successor_log_counts", torch.zeros(shape))

    def set_transitions(self, sequences: Sequence[Sequence[int]]) -> None:
        """Fill the transition table from training sequences (a no-op without one)."""
        if not self.config.transition_width:
            return
        succ, logc = transition_table(sequences, self.config.vocab_size, width=self.config.transition_width)
        self.successors.copy_(succ)
        self.successor_log_counts.copy_(logc)

    @property
    def uses_prior(self) -> bool:
        return self.config.transition_width > 0 and self.config.transition_weight > 0

    @property
    def max_history(self) -> int:
        return self.config.max_len

    @property
    def window_len(self) -> int:
        return self.config.max_len + 1  # L inputs and their L shifted targets

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        """seq: (B, L) right-padded item indices -> hidden (B, L, D)."""
        return self.encoder(seq)

    def item_weights(self) -> torch.Tensor:
        return self.encoder.token_emb.weight  # (V, D), shared with the input embedding

    def dot_form(self) -> DotForm:
        return DotForm(self.item_weights(), None, self.prior_entries if self.uses_prior else None)

    def prior_entries(self, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The transition prior's nonzero entries: (B, L) -> (items (B, W), weighted log1p counts (B, W))."""
        last = seq.gather(1, last_valid_index(seq)[:, None]).squeeze(1)  # (B,); PAD for an empty history
        return self.successors[last].long(), self.config.transition_weight * self.successor_log_counts[last]

    def query(self, seq: torch.Tensor) -> torch.Tensor:
        """The hidden state at each history's last item. seq: (B, L) -> (B, D)."""
        return self.encoder.read(seq, last_valid_index(seq))

    def scores(self, seq: torch.Tensor) -> torch.Tensor:
        """Next-item scores for each history. seq: (B, L) -> (B, V); specials are -inf."""
        s = self.query(seq) @ self.item_weights().T  # (B, V)
        if self.uses_prior:
            s = s.scatter_add(1, *self.prior_entries(seq))  # PAD entries add 0 to PAD
        s[:, :N_SPECIAL] = float("-inf")
        return s

    def loss(self, seq: torch.Tensor) -> torch.Tensor:
        """Next-item loss at every valid position. seq: (B, L+1) right-padded training windows."""
        inp, target = seq[:, :-1], seq[:, 1:]  # (B, L), (B, L)
        valid = target != PAD
        h = self(inp)[valid]  # (N, D)
        pos = target[valid]  # (N,)
        w = self.item_weights()
        cfg = self.config
        kind = cfg.training_loss
        if kind == "softmax":
            logits = h @ w.T  # (N, V)
            logits[:, :N_SPECIAL] = float("-inf")
            return cross_entropy(logits, pos, smoothing=cfg.label_smoothing)
        if kind == "bce":
            neg = torch.randint(N_SPECIAL, cfg.vocab_size, pos.shape, device=pos.device)
            pos_logit = (h * w[pos]).sum(-1)
            neg_logit = (h * w[neg]).sum(-1)
            return F.binary_cross_entropy_with_logits(
                torch.cat([pos_logit, neg_logit]),
                torch.cat([torch.ones_like(pos_logit), torch.zeros_like(neg_logit)]),
            )
        neg, correction = self.sampler(pos.device)  # (K,), (K,)
        pos_logit = (h * w[pos]).sum(-1, keepdim=True)  # (N, 1)
        neg_logit = h @ w[neg].T - correction  # (N, K)
        # A shared negative that is the row's own target is not a negative.
        neg_logit = neg_logit.masked_fill(neg[None, :] == pos[:, None], float("-inf"))
        logits = torch.cat([pos_logit, neg_logit], dim=1)  # (N, 1 + K)
        return cross_entropy(logits, torch.zeros_like(pos), smoothing=cfg.label_smoothing)
