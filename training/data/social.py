"""Social interaction logs ("user src performed action on user dst at time") and their chronological protocol."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch

from models.ids import from_csv_cell
from training.data.tables import DataFormatError, is_csv, read_table, require_ids, sha256, unix_times

COLUMNS = ("src", "dst", "action", "timestamp")


@dataclass
class SocialLog:
    """Events sorted by time (stable: ties keep file order), as parallel arrays."""

    src: np.ndarray  # (N,) object: raw user ids
    dst: np.ndarray  # (N,) object
    action: np.ndarray  # (N,) object
    time: np.ndarray  # (N,) float64 unix seconds
    source: str
    sha256: str
    dropped_self_loops: int = 0
    dropped_duplicates: int = 0

    def __len__(self) -> int:
        return len(self.time)


def load_social(path: Path, *, drop_self_loops: bool = True) -> SocialLog:
    """A CSV (optionally gzipped) or Parquet log with columns src, dst, action, timestamp (unix seconds
    or ISO 8601; src and dst may be named user_id and item_id, as `retrainer.export_history` writes them), any
    action vocabulary. Exact duplicate rows are dropped; self-loops too by default."""
    df = read_table(path)
    if "src" not in df.columns and "dst" not in df.columns and {"user_id", "item_id"} <= set(df.columns):
        df = df.rename(columns={"user_id": "src", "item_id": "dst"})  # the service's history export
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        header = [c for c in df.columns if c != "_line"]
        raise DataFormatError(path, 1, f"missing column(s) {missing}; a social log needs {list(COLUMNS)}, got {header}")
    if df.empty:
        raise DataFormatError(path, 2, "no events")
    for col in ("src", "dst", "action"):
        df[col] = df[col].str.strip()
        if is_csv(path):  # a spreadsheet-escaped id is taken back (models.ids.to_csv_cell)
            df[col] = df[col].map(from_csv_cell)
    require_ids(df, ["src", "dst", "action"], path)
    df["time"] = unix_times(df, "timestamp", path, what="timestamp")
    n = len(df)
    df = df.drop_duplicates(subset=["src", "dst", "action", "time"])
    dup = n - len(df)
    loops = 0
    if drop_self_loops:
        self_loop = (df["src"] == df["dst"]).to_numpy()
        loops = int(self_loop.sum())
        df = df[~self_loop]
    if df.empty:
        raise DataFormatError(path, None, "no events left after dropping self-loops and duplicates")
    df = df.sort_values("time", kind="stable")
    return SocialLog(
        src=df["src"].to_numpy(object),
        dst=df["dst"].to_numpy(object),
        action=df["action"].to_numpy(object),
        time=df["time"].to_numpy(np.float64),
        source=str(path.name),
        sha256=sha256([path]),
        dropped_self_loops=loops,
        dropped_duplicates=dup,
    )


@dataclass
class Periods:
    """Chronological cut points into a SocialLog: [0, valid) train, [valid, test) validation, [test, N) test."""

    valid: int
    test: int

    @classmethod
    def of(cls, n: int, *, valid_share: float = 0.1, test_share: float = 0.1) -> Periods:
        # The periods take the share rounded up (39,042 of MathOverflow's 390,414 events are the test).
        test = n - math.ceil(n * test_share - 1e-9)
        valid = test - math.ceil(n * valid_share - 1e-9)
        if not 0 < valid <= test < n:
            raise ValueError(f"{n} events are too few for a {valid_share}/{test_share} validation/test split")
        return cls(valid, test)


@dataclass
class Queries:
    """Evaluation queries of one period: event indices into the log whose actor has an earlier event
    and whose target was known before the period began."""

    event: np.ndarray  # (Q,) int: index of the query event in the log
    repeat: np.ndarray  # (Q,) bool: the actor interacted with the target before


def period_queries(log: SocialLog, start: int, end: int) -> Queries:
    """The queries among events [start, end): known target (seen as src or dst before `start`), actor with
    at least one earlier event (any period)."""
    known = set(log.src[:start]) | set(log.dst[:start])
    first_src: dict[str, int] = {}
    for i, s in enumerate(log.src[:end]):
        first_src.setdefault(s, i)
    seen_pairs = set(zip(log.src[:start], log.dst[:start], strict=True))
    events, repeat = [], []
    for i in range(start, end):
        s, d = log.src[i], log.dst[i]
        if first_src[s] < i and d in known:
            events.append(i)
            repeat.append((s, d) in seen_pairs)
        seen_pairs.add((s, d))
    return Queries(np.asarray(events, dtype=np.int64), np.asarray(repeat, dtype=bool))


class TwoWay(NamedTuple):
    """Each event twice along the timelines (see `two_way`)."""

    owner: np.ndarray  # (2N,) whose timeline the row is on
    other: np.ndarray  # (2N,) the target (own step) or the actor (received step)
    action: np.ndarray  # (2N,) the action or its incoming form
    time: np.ndarray  # (2N,)
    order: np.ndarray  # (2N,) rows of [as actor..., as target...] in timeline order
    event_row: np.ndarray  # (N,) each event's row as its actor's


def two_way(
    src: np.ndarray, dst: np.ndarray, *, actions: np.ndarray, incoming_actions: np.ndarray, times: np.ndarray
) -> TwoWay:
    """Each event twice, as its actor's step (other = the target, the action) and as its target's
    (other = the actor, the incoming form), along the timelines. Ordered by time; at equal times a
    user's own events come before what others did to them, so a query never sees a step stamped with
    its own second (file order cannot say which came first)."""
    n = len(times)
    order = np.lexsort((np.tile(np.arange(n), 2), np.repeat([0, 1], n), np.tile(times, 2)))
    row = np.empty(2 * n, dtype=np.int64)
    row[order] = np.arange(2 * n)
    return TwoWay(
        np.concatenate([src, dst])[order],
        np.concatenate([dst, src])[order],
        np.concatenate([actions, incoming_actions])[order],
        np.tile(times, 2)[order],
        order,
        row[:n],
    )


class Timelines:
    """Every actor's events in time order, flattened (CSR), for vectorised history windows.

    Built from per-event indices: target (user index), action index, time. `window(events, L)` gives
    each event's actor's L events strictly before it, left-padded (newest last), as tensors.
    """

    def __init__(self, actors: np.ndarray, targets: np.ndarray, actions: np.ndarray, times: np.ndarray) -> None:
        codes, _ = pd.factorize(actors)
        order = np.argsort(codes, kind="stable")  # time order kept within an actor
        counts = np.bincount(codes)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self.position = np.empty(len(codes), dtype=np.int64)
        self.position[order] = np.arange(len(codes))
        self.start = offsets[codes]  # (N,) where each event's actor's timeline begins
        self.targets = torch.from_numpy(np.asarray(targets, dtype=np.int64)[order])
        self.actions = torch.from_numpy(np.asarray(actions, dtype=np.int64)[order])
        self.times = torch.from_numpy(np.asarray(times, dtype=np.float64)[order])

    @classmethod
    def both_directions(
        cls,
        src: np.ndarray,
        dst: np.ndarray,
        *,
        src_index: np.ndarray,
        dst_index: np.ndarray,
        actions: np.ndarray,
        incoming_actions: np.ndarray,
        times: np.ndarray,
    ) -> tuple[Timelines, np.ndarray]:
        """Every user's timeline with what they did and what others did to them (`two_way`) ->
        (timelines, each event's row): `window(rows[events], L)` is each event's two-way history."""
        rows = two_way(src, dst, actions=actions, incoming_actions=incoming_actions, times=times)
        other = np.concatenate([dst_index, src_index])[rows.order]  # the same rows, as user indices
        return cls(rows.owner, other, rows.action, rows.time), rows.event_row

    def earlier(self, events: np.ndarray) -> np.ndarray:
        """How many events each event's actor had before it."""
        return self.position[events] - self.start[events]

    def window(self, events: np.ndarray, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(targets, actions, times), each (B, W) with W <= length: the newest `length` earlier events,
        left-padded with 0 (time 0); columns no row uses are dropped."""
        n = torch.from_numpy(np.minimum(self.earlier(events), length))
        width = max(1, int(n.max())) if len(n) else 1
        pos = torch.from_numpy(self.position[events])[:, None] - width + torch.arange(width)[None, :]  # (B, W)
        valid = torch.arange(width)[None, :] >= (width - n)[:, None]
        pos = pos.clamp(min=0)
        return (
            self.targets[pos].masked_fill(~valid, 0),
            self.actions[pos].masked_fill(~valid, 0),
            self.times[pos].masked_fill(~valid, 0.0),
        )
