"""Staypoint batches: the MHSA model's input type, built with the shared feature bucketing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from models.features import duration_bin, hour_quarter, time_slot
from models.ids import PAD


@dataclass
class StayBatch:
    """A batch of staypoint histories, batch first, right-padded with 0."""

    loc: torch.Tensor  # (B, L) location indices
    hour: torch.Tensor  # (B, L) 0..23
    quarter: torch.Tensor  # (B, L) 0..3
    weekday: torch.Tensor  # (B, L) 0..6
    duration: torch.Tensor  # (B, L) duration bins 0..95
    user: torch.Tensor  # (B,) user indices; 0 = no user contribution
    target: torch.Tensor | None = None  # (B,) next location, for the loss

    def __len__(self) -> int:
        return int(self.loc.size(0))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> StayBatch:
        return self._map(lambda v: v.to(device, non_blocking=non_blocking))

    def index(self, idx: torch.Tensor) -> StayBatch:
        """Rows `idx`, trimmed to their longest history."""
        length = int((self.loc[idx] != PAD).sum(1).max())
        return self._map(lambda v: v[idx] if v.dim() == 1 else v[idx, :length])

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> StayBatch:
        return StayBatch(
            fn(self.loc),
            fn(self.hour),
            fn(self.quarter),
            fn(self.weekday),
            fn(self.duration),
            fn(self.user),
            None if self.target is None else fn(self.target),
        )


Step = tuple[int, int, int, int]  # (location index, start minute of day, weekday, duration in minutes)


def collate_staypoints(
    histories: list[list[Step]], users: list[int], targets: list[int] | None = None, max_len: int | None = None
) -> StayBatch:
    """Raw staypoint steps -> a right-padded StayBatch with the shared bucketing.

    Histories longer than `max_len` keep their most recent steps.
    """
    rows = [h[-max_len:] if max_len else h for h in histories]
    if any(not r for r in rows):
        raise ValueError("every history needs at least one staypoint")
    length = max(len(r) for r in rows)
    t = torch.zeros(4, len(rows), length, dtype=torch.long)
    for i, r in enumerate(rows):
        t[:, i, : len(r)] = torch.tensor(r, dtype=torch.long).T
    loc, start_min, weekday, duration = t
    hour, quarter = hour_quarter(time_slot(start_min))
    return StayBatch(
        loc=loc,
        hour=hour,
        quarter=quarter,
        weekday=weekday,
        duration=duration_bin(duration),
        user=torch.tensor(users, dtype=torch.long),
        target=None if targets is None else torch.tensor(targets, dtype=torch.long),
    )
