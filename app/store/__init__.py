"""Where live user events live: what POST /events appends after an artifact's final histories.

The artifacts' own histories stay in their memory-mapped tables (models/histories.py); the store holds
live events only, so a service start copies nothing into it. One interface, two stores: embedded
SQLite (the default; WAL, fsync on commit) and Redis (for several service instances; durable when the
server runs with append-only persistence). Events are kept per namespace, the data set a model was
trained on, so every model of one data set sees the same events.

- `append` returns only after the events are durably stored. An event id is remembered with a digest
  of its payload: the same id and payload again is a no-op ("duplicate"), the same id with another
  payload is refused ("conflict"), whatever happened to the event since.
- Each user keeps at most `keep` live events of its own and, separately, at most `keep` received
  steps (what other users did to it, `Event.received`), the newest by time: what others do to a user
  never pushes out what it did. Older ones are dropped on write (their ids stay known); an event that
  is older than everything kept is dropped in its own write and reported "dropped_old". Reads return
  at most `limit` newest events of each kind per user, merged by time.
"""

from __future__ import annotations

from pathlib import Path

from app.store.base import (
    RECENT_KEEP_S,
    Arrival,
    Candidate,
    Event,
    HistoryStore,
    Mode,
    OnlineKey,
    Outcome,
    StoredEvents,
    StoreError,
    Sums,
    UserKey,
    UserStats,
    Variant,
    redact,
)
from app.store.redis_store import RedisStore
from app.store.sqlite_store import SQLiteStore
from models.engine import LIVE_EVENTS

__all__ = [
    "RECENT_KEEP_S",
    "Arrival",
    "Candidate",
    "Event",
    "HistoryStore",
    "Mode",
    "OnlineKey",
    "Outcome",
    "RedisStore",
    "SQLiteStore",
    "StoreError",
    "StoredEvents",
    "Sums",
    "UserKey",
    "UserStats",
    "Variant",
    "open_store",
    "redact",
]


def open_store(
    kind: str,
    *,
    sqlite_path: Path,
    redis_url: str,
    redis_prefix: str = "seqserve:",
    keep: int = LIVE_EVENTS,
    redis_password: str | None = None,
    recent_keep_s: float = RECENT_KEEP_S,
) -> HistoryStore:
    if kind == "sqlite":
        return SQLiteStore(sqlite_path, keep=keep)
    if kind == "redis":
        # Not pinged here: the client reconnects by itself, and /readyz reports while Redis is away.
        return RedisStore(redis_url, redis_prefix, keep=keep, password=redis_password, recent_keep_s=recent_keep_s)
    raise ValueError(f"unknown history store {kind!r} (sqlite or redis)")
