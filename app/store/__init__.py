"""Where live user events live: what POST /events appends after an artifact's final histories.

The artifacts' own histories stay in their memory-mapped tables (models/history_table.py); the store holds
live events only, so a service start copies nothing into it. Two interfaces: `HistoryStore`
(app/store/histories.py: the events, read by user and by span, and the users that have any) and
`ProductionState` (app/store/state.py: pins, candidates and trials, the arrivals log, online sums),
each implemented by every backend, in a module each: embedded SQLite (the default; WAL, fsync on
commit), Redis (for several service instances; durable when the server runs with append-only
persistence) and Redis Cluster (the Redis store's keys hash-tagged by user bucket, for more than one
server's memory and core). The backend is one connection serving both, so an appended event and its
arrival are one write (on a cluster, one write per bucket). Events are kept per namespace, the data set a model was
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
from typing import Any

from app.store.base import Store, StoreError, redact
from app.store.histories import RECENT_KEEP_S, Event, HistoryStore, Outcome, StoredEvents
from app.store.redis_cluster_store import BUCKETS, RedisClusterStore
from app.store.redis_store import RedisStore
from app.store.sqlite_store import SQLiteStore
from app.store.state import (
    EXPOSURE_BUCKET_S,
    MAX_HIDDEN,
    MAX_NAMED_FILTERS,
    Arrival,
    Candidate,
    Exposure,
    ExposureKey,
    HiddenItem,
    Mode,
    OnlineKey,
    ProductionState,
    RetrainRecord,
    Sums,
    Traffic,
    TrafficKey,
    TrialEnd,
    UserKey,
    UserStats,
    Variant,
)
from models.queries import LIVE_EVENTS

__all__ = [
    "EXPOSURE_BUCKET_S",
    "MAX_HIDDEN",
    "MAX_NAMED_FILTERS",
    "RECENT_KEEP_S",
    "Arrival",
    "Candidate",
    "Event",
    "Exposure",
    "ExposureKey",
    "HiddenItem",
    "HistoryStore",
    "Mode",
    "OnlineKey",
    "Outcome",
    "ProductionState",
    "RedisClusterStore",
    "RedisStore",
    "RetrainRecord",
    "SQLiteStore",
    "Store",
    "StoreError",
    "StoredEvents",
    "Sums",
    "Traffic",
    "TrafficKey",
    "TrialEnd",
    "UserKey",
    "UserStats",
    "Variant",
    "distinct",
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
    redis_wait_replicas: int = 0,
    redis_wait_ms: int = 1000,
    redis_buckets: int = BUCKETS,
) -> SQLiteStore | RedisStore:
    """The store `kind` names; each backend serves both interfaces, histories and production state."""
    if kind == "sqlite":
        return SQLiteStore(sqlite_path, keep=keep)
    redis_args: dict[str, Any] = {
        "keep": keep,
        "password": redis_password,
        "recent_keep_s": recent_keep_s,
        "wait_replicas": redis_wait_replicas,
        "wait_timeout_ms": redis_wait_ms,
    }
    # Neither is pinged here: the client reconnects by itself, and /readyz reports while Redis is away.
    if kind == "redis":
        return RedisStore(redis_url, redis_prefix, **redis_args)
    if kind == "redis-cluster":
        return RedisClusterStore(redis_url, redis_prefix, buckets=redis_buckets, **redis_args)
    raise ValueError(f"unknown history store {kind!r} (sqlite, redis or redis-cluster)")


def distinct(*stores: Store | None) -> list[Store]:
    """The stores behind the interfaces, each once: one backend usually serves both."""
    out: list[Store] = []
    for s in stores:
        if s is not None and all(s is not o for o in out):
            out.append(s)
    return out
