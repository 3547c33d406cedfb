"""Time and duration bucketing for staypoints: the only place these features are computed."""

from __future__ import annotations

import datetime as dt

import torch

SLOT_MINUTES = 15
DURATION_BIN_MINUTES = 30
MAX_DURATION_MINUTES = 2 * 24 * 60 - 1  # 2879: two days less a minute, as in the MHSA protocol
N_DURATION_BINS = MAX_DURATION_MINUTES // DURATION_BIN_MINUTES + 1  # 96
N_HOURS, N_QUARTERS, N_WEEKDAYS = 24, 4, 7

BUCKETING = {
    "slot_minutes": SLOT_MINUTES,
    "duration_bin_minutes": DURATION_BIN_MINUTES,
    "max_duration_minutes": MAX_DURATION_MINUTES,
    "n_duration_bins": N_DURATION_BINS,
}


def time_slot(start_min: torch.Tensor) -> torch.Tensor:
    """Minute of the day (0..1439) -> 15-minute slot (0..95)."""
    return start_min // SLOT_MINUTES


def hour_quarter(slot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot -> (hour 0..23, quarter of the hour 0..3)."""
    return slot // 4, slot % 4


def duration_bin(duration_min: torch.Tensor) -> torch.Tensor:
    """Minutes -> 30-minute bin (0..95), durations capped at two days less a minute."""
    return duration_min.clamp(0, MAX_DURATION_MINUTES) // DURATION_BIN_MINUTES


def from_times(started_at: dt.datetime, finished_at: dt.datetime) -> tuple[int, int, int]:
    """(start minute of day, weekday, duration in minutes) of a stay, in the stay's own local time."""
    return (
        started_at.hour * 60 + started_at.minute,
        started_at.weekday(),
        int((finished_at - started_at).total_seconds() // 60),
    )
