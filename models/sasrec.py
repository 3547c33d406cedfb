"""SASRec: a causal transformer that predicts the next item at every position."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.base import DotForm, RecommenderConfig, SequentialRecommender
from models.ids import N_SPECIAL, PAD
from models.layers import (
    LENGTH_GROUPS,
    NegativeSampler,
    SequenceEncoder,
    gather_rows,
    last_valid_index,
    length_groups,
    shared_negatives_loss,
)

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

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")

    @property
    def training_loss(self) -> str:
        """The loss trained with: `loss`, with "auto" resolved by the catalog's size."""
        if self.loss != "auto":
            return self.loss
        return "softmax" if self.vocab_size <= AUTO_FULL_RATIO * self.n_negatives else "sampled_softmax"


class SASRec(SequentialRecommender):
    causal = True  # the contract pre-flight checks: a position never sees later items

    def __init__(self, config: SASRecConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = SequenceEncoder.from_config(config, vocab_size=config.vocab_size, causal=self.causal)
        self.sampler = NegativeSampler(
            config.vocab_size, config.n_negatives, config.negative_pop_share, config.logq_correction
        )
        self._add_transition_table()

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

    def query(self, seq: torch.Tensor) -> torch.Tensor:
        """The hidden state at each history's last item. seq: (B, L) -> (B, D)."""
        return self.encoder.read(seq, last_valid_index(seq))

    def scores(self, seq: torch.Tensor) -> torch.Tensor:
        """Next-item scores for each history. seq: (B, L) -> (B, V); specials are -inf."""
        s = self.add_prior(self.query(seq) @ self.item_weights().T, seq)  # (B, V)
        s[:, :N_SPECIAL] = float("-inf")
        return s

    def loss(self, seq: torch.Tensor) -> torch.Tensor:
        """Next-item loss at every valid position. seq: (B, L+1) right-padded training windows."""
        cfg = self.config
        kind = cfg.training_loss
        parts = [seq[rows, :n] for rows, n in length_groups((seq != PAD).sum(1), LENGTH_GROUPS)]  # less padding
        inputs = [p[:, :-1] for p in parts]  # (b, l) each
        valid = [p[:, 1:] != PAD for p in parts]  # (b, l) each
        pos = torch.cat([p[:, 1:][v] for p, v in zip(parts, valid, strict=True)])  # (N,)
        w = self.item_weights()
        if kind == "softmax":
            h = self._states(inputs, valid, gather_rows(w, *inputs))  # (N, D)
            # The specials are not classes: left out of the logits, so label smoothing spreads over
            # the items only, as torch's own cross-entropy does it in one kernel.
            return F.cross_entropy(h @ w[N_SPECIAL:].T, pos - N_SPECIAL, label_smoothing=cfg.label_smoothing)
        if kind == "bce":
            neg = torch.randint(N_SPECIAL, cfg.vocab_size, pos.shape, device=pos.device)
            *tokens, w_pos, w_neg = gather_rows(w, *inputs, pos, neg)
            h = self._states(inputs, valid, tokens)
            pos_logit, neg_logit = (h * w_pos).sum(-1), (h * w_neg).sum(-1)
            return F.binary_cross_entropy_with_logits(
                torch.cat([pos_logit, neg_logit]),
                torch.cat([torch.ones_like(pos_logit), torch.zeros_like(neg_logit)]),
            )
        neg, correction = self.sampler(pos.device)  # (K,), (K,)
        *tokens, w_pos, w_neg = gather_rows(w, *inputs, pos, neg)
        h = self._states(inputs, valid, tokens)  # (N, D)
        pos_logit = (h * w_pos).sum(-1)  # (N,)
        neg_logit = torch.addmm(-correction, h, w_neg.T)  # (N, K): h @ w_neg.T - correction in one kernel
        return shared_negatives_loss(pos_logit, neg_logit, pos, neg, smoothing=cfg.label_smoothing)

    def _states(
        self, inputs: list[torch.Tensor], valid: list[torch.Tensor], tokens: list[torch.Tensor]
    ) -> torch.Tensor:
        """Hidden states at the valid positions of each group's inputs (b, l), in order -> (N, D)."""
        return torch.cat([self.encoder(x, tokens=t)[v] for x, v, t in zip(inputs, valid, tokens, strict=True)])
