"""The interface every sequential recommender offers to training and serving."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import nn


class SequentialRecommender(nn.Module, ABC):
    causal: ClassVar[bool]  # whether a position may only see earlier items (checked by pre-flight)
    config: Any  # the dataclass the model was built from

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

    @abstractmethod
    def scores(self, seq: torch.Tensor) -> torch.Tensor:
        """(B, L) right-padded histories -> (B, V) next-item scores; non-items are -inf."""

    @abstractmethod
    def loss(self, seq: torch.Tensor) -> torch.Tensor:
        """(B, window_len) right-padded training windows -> scalar training loss."""
