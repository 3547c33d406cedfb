"""The history store interface: per-namespace live user events, what POST /events appends after an
artifact's final histories and what a by-user query reads (app/store/__init__.py has the contract)."""

from __future__ import annotations

import hashlib
import json
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from app.store.base import Store, json_ts
from models.queries import LIVE_EVENTS, RecentEvent, Timeline

# "conflict": the id was stored with another payload. When any event of a call conflicts, the call
# stores nothing: the conflicting ones say "conflict", the others "skipped". "dropped_old": taken (its
# id is known from now on) but older than the `keep` newest of its user, so not kept.
Outcome = Literal["stored", "duplicate", "conflict", "skipped", "dropped_old"]
# Live events of all users one query reads for recent activity, at most (a day of a busy network):
# beyond it the newest are counted and a warning logged.
RECENT_EVENTS = 200_000
# The Redis store keeps every user's events of this long before its newest in a per-namespace set for
# recent activity (SQLite reads them from its events table): a model's windows must fit in it
# (SEQSERVE_RECENT_KEEP_S; a model whose longest window is longer is logged at load).
RECENT_KEEP_S = 7 * 24 * 3600.0
# A user -> the artifact's events of that user as (raw id, time or None) keys.
StoredEvents = Callable[[str], set[tuple[str | None, float | None]]]


@dataclass(frozen=True)
class Event:
    event_id: str
    user_id: str
    item_id: str
    timestamp: float  # unix seconds; NaN when the data has no times
    action: str | None = None
    received: bool = False  # a step another user's event adds to this user's timeline (capped apart)
    # The answer the user took this item from (online evaluation's attribution); not part of the payload.
    recommendation_id: str | None = None

    @property
    def digest(self) -> str:
        """Identifies the payload, so a reused event id with another payload is recognised."""
        payload = json.dumps([self.user_id, self.item_id, json_ts(self.timestamp), self.action])
        return hashlib.sha256(payload.encode()).hexdigest()[:32]


class HistoryStore(Store):
    """Per-namespace live user events, appended after an artifact's final histories."""

    # Whether reads are quick local calls (SQLite's WAL readers never wait on a writer) that may run
    # on the event loop when small; a network store's reads always go to a worker thread.
    local_reads: bool = False
    # How far back `recent` reaches before the newest event; None: as far as the kept events go.
    recent_horizon_s: float | None = None

    def __init__(self, keep: int = LIVE_EVENTS) -> None:
        self.keep = keep  # live events kept per user

    @abstractmethod
    def drop_trained_events(self, namespace: str, data_hash: str, stored: StoredEvents) -> int | None:
        """Drop the live events that `stored` says the artifact of `data_hash` was trained on, unless
        that data hash was handled already (None). Walks the users with live events only; their ids stay known.
        Returns how many events it dropped."""

    @abstractmethod
    def append(self, namespace: str, events: Sequence[Event]) -> list[Outcome]:
        """Store events durably; per event, whether it was stored or a duplicate. If any event reuses a
        stored id with another payload, nothing is stored (see Outcome)."""

    @abstractmethod
    def events(self, namespace: str, users: Sequence[str], limit: int | None = None) -> dict[str, Timeline]:
        """The newest `limit` (default: all kept) live events of each kind (own, received) of each user
        that has any, merged, oldest first (by timestamp, then arrival)."""

    @abstractmethod
    def recent(self, namespace: str, *, start: float, end: float, limit: int = RECENT_EVENTS) -> list[RecentEvent]:
        """Every user's own live events (not the steps others' events added) with start <= time < end, the
        newest `limit` of them, oldest first."""

    @abstractmethod
    def pending(self, namespace: str) -> int:
        """Own live events of `namespace` that no served version was trained on yet: what a warm
        retrain would add (retrainer.export_history exports them). Costs a pass over the live users."""

    @abstractmethod
    def users(self, namespace: str) -> Iterator[str]:
        """Every user with live events."""
