"""Who is being interacted with right now: per query, every user's interactions received and made in a
few windows before the query's time (docs/decisions/recent-activity.md).

Training counts them from its log, serving from the artifact's event log plus the live events of the
history store; both call `recent_activity`, so they cannot drift. Only events strictly earlier than the
query count. The result is sparse: a few hundred users act in a day, of millions.

artifacts/<name>/<version>/events/  (the whole log, oldest first, memory-mapped)
  times.npy     float64 (N,)  unix seconds, ascending
  made.npy      int32 (N,)    the actor's user index (UNK when the model does not know it)
  received.npy  int32 (N,)    the target's user index
  actions.npy   int32 (N,)    the action's index
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from models.history_table import HistoryTableError, map_column
from models.ids import N_SPECIAL

FOLDER = "events"
# Per query, at most this many of the newest events of the longest window are counted: a network with
# millions of events a day stays bounded in training batches and requests (MathOverflow: about 170
# a day, never near it). Training and serving share the bound, so they count alike.
MAX_EVENTS = 20_000
_COLUMNS: dict[str, type[np.generic]] = {
    "times": np.float64,
    "made": np.int32,
    "received": np.int32,
    "actions": np.int32,
}


@dataclass(frozen=True)
class Activity:
    """Sparse counts: entry n says user `users[n]` received, made (had with the querying user's
    contacts; received and made per action) `counts[n]` interactions in each window before query
    `rows[n]`'s time. Entries are ordered by query."""

    rows: np.ndarray  # int64 (N,)
    users: np.ndarray  # int64 (N,)
    counts: np.ndarray  # float32 (N, F): per kind of count above, one column per window

    @classmethod
    def empty(cls, n_features: int) -> Activity:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, n_features), np.float32))

    def row(self, i: int) -> Activity:
        """Query i's entries alone (as query 0)."""
        a, b = np.searchsorted(self.rows, [i, i + 1])
        return Activity(np.zeros(b - a, np.int64), self.users[a:b], self.counts[a:b])


def recent_activity(
    times: np.ndarray,
    *,
    made: np.ndarray,
    received: np.ndarray,
    query_times: np.ndarray,
    windows: Sequence[float],
    contacts: np.ndarray | None = None,
    actions: np.ndarray | None = None,
    n_actions: int = 0,
) -> Activity:
    """Events (ascending `times`; the actor's and the target's user indices) -> per query, each user's
    interactions received and made in (t - w, t) for each window w, t the query's time; with
    `contacts` ((Q, C) user indices per query, 0 = none), also those with one of the query's contacts
    (either direction); with `actions` (each event's action index), also received and made per action
    index N_SPECIAL .. N_SPECIAL + n_actions - 1. Users below N_SPECIAL (unknown to the model) are left out."""
    f = len(windows)
    sides = 2 + (contacts is not None) + (2 * n_actions if actions is not None else 0)
    if not f or not len(query_times):
        return Activity.empty(sides * f)
    q = np.asarray(query_times, dtype=np.float64)
    hi = np.searchsorted(times, q, side="left")  # strictly earlier than the query
    lo = np.maximum(np.searchsorted(times, q - max(windows), side="right"), hi - MAX_EVENTS)
    n = np.maximum(hi - lo, 0)
    rows = np.repeat(np.arange(len(q)), n)
    idx = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
    age = q[rows] - times[idx]
    src, dst = made[idx].astype(np.int64), received[idx].astype(np.int64)
    parts = [(dst, rows, age, 0), (src, rows, age, 1)]
    if contacts is not None:
        span = int(max(src.max(initial=0), dst.max(initial=0), contacts.max(initial=0))) + 1
        known = np.unique(np.arange(len(q))[:, None] * span + contacts)  # (query, contact) keys
        # The other end of an event whose one end is a contact of the query's user.
        for other, end in ((dst, src), (src, dst)):
            hit = np.isin(rows * span + end, known) & (end >= N_SPECIAL)
            parts.append((other[hit], rows[hit], age[hit], 2))
    if actions is not None:  # received, then made, per action
        base = 3 if contacts is not None else 2
        act = actions[idx].astype(np.int64) - N_SPECIAL
        ok = (act >= 0) & (act < n_actions)
        parts.append((dst[ok], rows[ok], age[ok], base + act[ok]))
        parts.append((src[ok], rows[ok], age[ok], base + n_actions + act[ok]))
    users = np.concatenate([p[0] for p in parts])
    rows2 = np.concatenate([p[1] for p in parts])
    age2 = np.concatenate([p[2] for p in parts])
    side = np.concatenate([np.broadcast_to(p[3], len(p[0])) for p in parts])
    keep = users >= N_SPECIAL
    users, side, rows2, age2 = users[keep], side[keep], rows2[keep], age2[keep]
    # One entry per (query, user), in query order.
    span = int(users.max()) + 1 if len(users) else 1
    keys, inverse = np.unique(rows2 * span + users, return_inverse=True)
    # Each event in the narrowest window that holds it, then summed over the wider ones: one bincount.
    order = np.argsort(windows, kind="stable")
    narrowest = np.searchsorted(np.asarray(windows, dtype=np.float64)[order], age2, side="right")
    inside = narrowest < f
    cells = (inverse[inside] * sides + side[inside]) * f + narrowest[inside]
    first = np.bincount(cells, minlength=len(keys) * sides * f).reshape(len(keys), sides, f)
    counts = np.cumsum(first, axis=2)[:, :, np.argsort(order)]  # back to the windows' given order
    return Activity(keys // span, keys % span, counts.reshape(len(keys), sides * f).astype(np.float32))


def merge(a: Activity, b: Activity) -> Activity:
    """Counts of two disjoint sets of events over the same queries, summed."""
    if not len(b.rows):
        return a
    if not len(a.rows):
        return b
    rows, users = np.concatenate([a.rows, b.rows]), np.concatenate([a.users, b.users])
    span = int(users.max()) + 1
    keys, inverse = np.unique(rows * span + users, return_inverse=True)
    counts = np.zeros((len(keys), a.counts.shape[1]), np.float32)
    np.add.at(counts, inverse, np.concatenate([a.counts, b.counts]))
    return Activity(keys // span, keys % span, counts)


def stack(parts: Sequence[Activity], n_features: int) -> Activity:
    """Per-query activities (each as query 0) -> one, query i = parts[i]."""
    if not parts:
        return Activity.empty(n_features)
    return Activity(
        np.concatenate([np.full(len(p.users), i, np.int64) for i, p in enumerate(parts)]),
        np.concatenate([p.users for p in parts]),
        np.concatenate([p.counts for p in parts]).reshape(-1, n_features),
    )


def as_tensors(a: Activity) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (index (2, N): query and user of each entry, counts (N, F))."""
    index = torch.from_numpy(np.stack([a.rows, a.users]).astype(np.int64))
    return index, torch.from_numpy(np.ascontiguousarray(a.counts, dtype=np.float32))


@dataclass(frozen=True)
class EventLog:
    """The artifact's events in time order: what serving counts recent activity from."""

    times: np.ndarray
    made: np.ndarray = field(kw_only=True)
    received: np.ndarray = field(kw_only=True)
    actions: np.ndarray = field(kw_only=True)

    def write(self, folder: Path) -> None:
        order = np.argsort(self.times, kind="stable")
        folder.mkdir(parents=True, exist_ok=True)
        for name, dtype in _COLUMNS.items():
            col = np.ascontiguousarray(np.asarray(getattr(self, name))[order], dtype=dtype)
            np.save(folder / f"{name}.npy", col, allow_pickle=False)

    @classmethod
    def read(cls, folder: Path) -> EventLog:
        """Memory-mapped; raises HistoryTableError naming the bad file."""
        cols = {name: map_column(folder / f"{name}.npy", dtype) for name, dtype in _COLUMNS.items()}
        if len({len(c) for c in cols.values()}) > 1:
            raise HistoryTableError(f"{', '.join(f'{n}.npy' for n in cols)} differ in length")
        times = cols["times"]
        if len(times) > 1 and not bool(np.all(np.diff(times) >= 0)):
            raise HistoryTableError("times.npy: not in time order")
        if len(times) and not (math.isfinite(float(times[0])) and math.isfinite(float(times[-1]))):
            raise HistoryTableError("times.npy: a time is not finite")  # in order: the ends bound the rest
        for name in ("made", "received", "actions"):
            if len(cols[name]) and int(cols[name].min()) < 0:
                raise HistoryTableError(f"{name}.npy: a negative index")
        return cls(cols["times"], made=cols["made"], received=cols["received"], actions=cols["actions"])
