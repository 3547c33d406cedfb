"""The interface every sequential recommender offers to training and serving."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from models.ids import N_SPECIAL, PAD
from models.transitions import pair_counts, top_successors

FILTER_KINDS = ("none", "bsa", "learned", "tv")  # RecommenderConfig.filter_kind (models/layers.py FilterSpec)


@dataclass
class RecommenderConfig:
    """The fields every sequential recommender's config shares."""

    vocab_size: int  # items + 2 specials (0 = padding, 1 = unknown)
    max_len: int = 50
    d_model: int = 64
    n_heads: int = 2
    n_layers: int = 2
    d_ff: int = 256
    dropout: float = 0.2
    # False: no dropout on the attention output, the published SASRec's placement
    # (docs/decisions/attention-output-dropout.md); True keeps torch's encoder-layer placement.
    attn_out_dropout: bool = True
    # A filter along the positions beside attention in every layer (models/layers.py FilterSpec,
    # docs/decisions/sequence-filters.md): "none", "bsa" (BSARec), "learned" (FMLP-Rec) or "tv" (TV-Rec);
    # its share of the token mixing (1 = the filter alone), BSARec's cut-off c, and TV-Rec's number of
    # basis filters M (32, its Beauty setting).
    filter_kind: str = "none"
    filter_mix: float = 0.7
    filter_cutoff: int = 5
    filter_bases: int = 32
    # Sampled softmax over negatives shared by the batch (0 = a full softmax where the model offers one).
    n_negatives: int = 1024
    negative_pop_share: float = 0.0  # share of sampled negatives drawn by item frequency
    logq_correction: bool = True  # False: no log-Q correction of sampled negatives (see NegativeSampler)
    # Share of the target's probability spread over the other candidates (the catalog, or the sampled
    # negatives) in the training loss; 0 = plain cross-entropy.
    label_smoothing: float = 0.0
    # A transition prior (models/transitions.py): each item's `transition_width` most frequent next
    # items, added to the next-item scores as transition_weight * log1p(count). The training job fills
    # the table and chooses the weight on validation; 0 = no table.
    transition_width: int = 0
    transition_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.vocab_size <= N_SPECIAL:
            raise ValueError("vocab_size must leave room for at least one item")
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be a multiple of n_heads")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.filter_kind not in FILTER_KINDS:
            raise ValueError(f"filter_kind must be one of {FILTER_KINDS}, got {self.filter_kind!r}")
        if not 0.0 <= self.filter_mix <= 1.0 or self.filter_cutoff < 1 or self.filter_bases < 1:
            raise ValueError("filter_mix must be in [0, 1], filter_cutoff >= 1 and filter_bases >= 1")
        if self.transition_width < 0 or self.transition_weight < 0:
            raise ValueError("transition_width and transition_weight must be >= 0")


@dataclass(frozen=True)
class DotForm:
    """A model whose scores are `query(seq) @ table.T + bias`, plus a few sparse additions per query,
    with the specials at -inf: what lets a wide catalog be ranked from coarse scores and a
    certificate (models/coarse.py)."""

    table: torch.Tensor  # (V, D)
    bias: torch.Tensor | None  # (V,) or None
    # (B, L) histories -> (items (B, W), additions (B, W) >= 0): added to those items' scores; a row's
    # items are distinct, or specials. The transition prior (models/transitions.py).
    additions: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None


class SequentialRecommender(nn.Module, ABC):
    causal: ClassVar[bool]  # whether a position may only see earlier items (checked by pre-flight)
    config: Any  # the dataclass the model was built from
    successors: torch.Tensor  # (V, transition_width) int32, with a transition table
    successor_log_counts: torch.Tensor  # (V, transition_width)

    def _add_transition_table(self) -> None:
        """Register the prior's buffers when the config asks for a table (call in __init__)."""
        if self.config.transition_width:  # only then: checkpoints from before the prior load unchanged
            shape = (self.config.vocab_size, self.config.transition_width)
            self.register_buffer("successors", torch.zeros(shape, dtype=torch.int32))
            self.register_buffer("successor_log_counts", torch.zeros(shape))

    @property
    @abstractmethod
    def max_history(self) -> int:
        """Most history items one query may carry."""

    @property
    def window_len(self) -> int:
        """Length of one training window given to `loss`."""
        return int(self.config.max_len)

    def set_item_frequencies(self, counts: torch.Tensor) -> None:
        """Give the training data's item counts (V,) to whatever samples negatives."""
        sampler = getattr(self, "sampler", None)
        if sampler is not None:
            sampler.set_frequencies(counts)

    def set_transitions(self, sequences: Sequence[Sequence[int]]) -> None:
        """Fill the transition table from training sequences (a no-op without one)."""
        if self.config.transition_width:
            self.set_transition_counts(*pair_counts(sequences, self.config.vocab_size))

    def set_transition_counts(self, keys: torch.Tensor, counts: torch.Tensor) -> None:
        """Fill the transition table from `models.transitions.pair_counts` (a no-op without one)."""
        if not self.config.transition_width:
            return
        succ, logc = top_successors(keys, counts, self.config.vocab_size, width=self.config.transition_width)
        self.successors.copy_(succ)
        self.successor_log_counts.copy_(logc)

    @property
    def uses_prior(self) -> bool:
        return self.config.transition_width > 0 and self.config.transition_weight > 0

    def prior_entries(self, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The transition prior's nonzero entries: (B, L) -> (items (B, W), weighted log1p counts (B, W))."""
        last_index = ((seq != PAD).sum(1) - 1).clamp(min=0)  # (B,)
        last = seq.gather(1, last_index[:, None]).squeeze(1)  # (B,); PAD for an empty history
        return self.successors[last].long(), self.config.transition_weight * self.successor_log_counts[last]

    def add_prior(self, s: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        """Scores (B, V) plus the prior for histories (B, L), where the model uses one."""
        if not self.uses_prior:
            return s
        return s.scatter_add(1, *self.prior_entries(seq))  # PAD entries add 0 to PAD

    @abstractmethod
    def scores(self, seq: torch.Tensor) -> torch.Tensor:
        """(B, L) right-padded histories -> (B, V) next-item scores; non-items are -inf."""

    def dot_form(self) -> DotForm | None:
        """The item table (and bias) behind `scores` when they are `query(seq) @ table.T + bias`;
        None for a model whose scores are something else."""
        return None

    def query(self, seq: torch.Tensor) -> torch.Tensor:
        """(B, L) right-padded histories -> (B, D) queries of the dot form (models with one)."""
        raise NotImplementedError(f"{type(self).__name__} has no dot form")

    @abstractmethod
    def loss(self, seq: torch.Tensor) -> torch.Tensor:
        """(B, window_len) right-padded training windows -> scalar training loss."""
