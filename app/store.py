"""Where user histories live: seeded from an artifact's final histories, appended to by POST /events.

One interface, two stores: embedded SQLite (the default; WAL, fsync on commit) and Redis (for several
service instances; durable when the server runs with append-only persistence). Histories are kept per
namespace, the data set a model was trained on, so every model of one data set sees the same events.
An `append` returns only after the events are durably stored; an event id already stored is a no-op.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Timeline = list[tuple[str, float]]  # (raw item id, unix time; NaN when the data had none), oldest first


@dataclass(frozen=True)
class Event:
    event_id: str
    user_id: str
    item_id: str
    timestamp: float


class StoreError(RuntimeError):
    """The store could not be reached or refused a write: nothing of the call was stored."""


def _ts(t: float | None) -> float:
    return math.nan if t is None else float(t)


def _json_ts(t: float) -> float | None:
    return None if math.isnan(t) else t


def _held(base: Timeline) -> set[tuple[str, float | None]]:
    """A new base's events as keys: live events it already holds (it was retrained on them) are dropped."""
    return {(i, _json_ts(t)) for i, t in base}


class HistoryStore(ABC):
    """Per-namespace user histories: an immutable seeded base plus appended live events."""

    kind: str
    # Whether reads are quick local calls (SQLite's WAL readers never wait on a writer) that may run
    # on the event loop; a network store's reads go to a worker thread.
    local_reads: bool = False

    @abstractmethod
    def seed(self, namespace: str, token: str, histories: Mapping[str, Timeline]) -> bool:
        """Replace the base with `histories` unless `token` (the data's hash) is already seeded.

        Live events that the new base contains are dropped. Returns whether it wrote.
        """

    @abstractmethod
    def append(self, namespace: str, events: Sequence[Event]) -> list[bool]:
        """Store events durably; per event, True when newly stored, False when its id was already there."""

    @abstractmethod
    def events(self, namespace: str, users: Sequence[str]) -> dict[str, Timeline]:
        """Live events of each user that has any, oldest first (by timestamp, then arrival)."""

    @abstractmethod
    def base(self, namespace: str, user: str) -> Timeline: ...

    @abstractmethod
    def users(self, namespace: str) -> Iterator[str]:
        """Every user with a base history or live events."""

    @abstractmethod
    def ping(self) -> None:
        """Raise StoreError when the store cannot be used."""

    @abstractmethod
    def close(self) -> None: ...

    def history(self, namespace: str, user: str) -> Timeline:
        """The whole history: base, then live events."""
        return self.base(namespace, user) + self.events(namespace, [user]).get(user, [])


class SQLiteStore(HistoryStore):
    """Embedded store: one file, WAL journal, synchronous=FULL so a commit survives a crash."""

    kind = "sqlite"
    local_reads = True
    _SCHEMA = """
    CREATE TABLE IF NOT EXISTS seeded (ns TEXT PRIMARY KEY, token TEXT NOT NULL, at REAL NOT NULL);
    CREATE TABLE IF NOT EXISTS base (ns TEXT, user TEXT, items TEXT NOT NULL, PRIMARY KEY (ns, user))
        WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS events (
        seq INTEGER PRIMARY KEY, ns TEXT NOT NULL, event_id TEXT NOT NULL, user TEXT NOT NULL,
        item TEXT NOT NULL, ts REAL, recorded_at REAL NOT NULL,
        folded INTEGER NOT NULL DEFAULT 0,  -- 1: a later base holds it; kept so its id stays known
        UNIQUE (ns, event_id));
    CREATE INDEX IF NOT EXISTS events_by_user ON events (ns, user, ts, seq);
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        conn = self._conn()
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"{path}: SQLite refused WAL mode (got {mode!r})")
        conn.executescript(self._SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        """One connection per thread: reads never wait on another thread's fsync."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from exc
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=10000")
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def _write(self, fn: Any) -> Any:
        with self._write_lock:
            conn = self._conn()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    out = fn(conn)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                return out
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from exc

    def seed(self, namespace: str, token: str, histories: Mapping[str, Timeline]) -> bool:
        def do(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT token FROM seeded WHERE ns = ?", (namespace,)).fetchone()
            if row is not None and row[0] == token:
                return False
            conn.execute("DELETE FROM base WHERE ns = ?", (namespace,))
            conn.executemany(
                "INSERT INTO base (ns, user, items) VALUES (?, ?, ?)",
                ((namespace, u, json.dumps([[i, _json_ts(t)] for i, t in evs])) for u, evs in histories.items()),
            )
            live = conn.execute("SELECT DISTINCT user FROM events WHERE ns = ? AND folded = 0",
                                (namespace,)).fetchall()
            for (user,) in live:
                held = _held(histories.get(user, []))
                if held:
                    rows = conn.execute("SELECT seq, item, ts FROM events WHERE ns = ? AND user = ? AND folded = 0",
                                        (namespace, user)).fetchall()
                    drop = [(seq,) for seq, item, ts in rows if (item, ts) in held]
                    conn.executemany("UPDATE events SET folded = 1 WHERE seq = ?", drop)
            conn.execute("INSERT OR REPLACE INTO seeded (ns, token, at) VALUES (?, ?, ?)",
                         (namespace, token, time.time()))
            return True

        return bool(self._write(do))

    def append(self, namespace: str, events: Sequence[Event]) -> list[bool]:
        def do(conn: sqlite3.Connection) -> list[bool]:
            now = time.time()
            out = []
            for e in events:
                cur = conn.execute(
                    "INSERT OR IGNORE INTO events (ns, event_id, user, item, ts, recorded_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (namespace, e.event_id, e.user_id, e.item_id, _json_ts(e.timestamp), now),
                )
                out.append(cur.rowcount == 1)
            return out

        return list(self._write(do))

    def events(self, namespace: str, users: Sequence[str]) -> dict[str, Timeline]:
        if not users:
            return {}
        out: dict[str, Timeline] = {}
        conn = self._conn()
        wanted = list(dict.fromkeys(users))
        try:
            for start in range(0, len(wanted), 500):  # SQLite's bound-parameter limit
                chunk = wanted[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT user, item, ts FROM events WHERE ns = ? AND user IN ({marks}) AND folded = 0"
                    " ORDER BY user, ts, seq",
                    (namespace, *chunk),
                ).fetchall()
                for user, item, ts in rows:
                    out.setdefault(user, []).append((item, _ts(ts)))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc
        return out

    def base(self, namespace: str, user: str) -> Timeline:
        row = self._conn().execute("SELECT items FROM base WHERE ns = ? AND user = ?", (namespace, user)).fetchone()
        return [(str(i), _ts(t)) for i, t in json.loads(row[0])] if row else []

    def users(self, namespace: str) -> Iterator[str]:
        rows = self._conn().execute(
            "SELECT user FROM base WHERE ns = ? UNION SELECT user FROM events WHERE ns = ? AND folded = 0 ORDER BY 1",
            (namespace, namespace),
        ).fetchall()
        return (u for (u,) in rows)

    def ping(self) -> None:
        try:
            self._conn().execute("SELECT 1").fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    def close(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        self._local = threading.local()


# Atomic per call: an id set guards each event, so a replay (or a race between instances) is a no-op.
_APPEND_LUA = """
local out = {}
for n = 2, #ARGV, 3 do
  local added = redis.call('SADD', KEYS[1], ARGV[n])
  if added == 1 then
    redis.call('RPUSH', ARGV[1] .. ARGV[n + 1], ARGV[n + 2])
    redis.call('SADD', KEYS[2], ARGV[n + 1])
  end
  out[#out + 1] = added
end
return out
"""


class RedisStore(HistoryStore):
    """Redis store for several instances. Keys: <prefix><ns>:{seeded, base (hash), ids, live, ev:<user>}.

    The keys the append script writes are derived inside it, so this needs one Redis server, not a cluster.
    """

    kind = "redis"

    def __init__(self, url: str, prefix: str = "seqserve:", timeout_s: float = 5.0) -> None:
        import redis

        self._redis_errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self.r = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                      decode_responses=True)
        self.prefix = prefix
        self._append = self.r.register_script(_APPEND_LUA)
        self.url = url

    def _k(self, namespace: str, what: str) -> str:
        return f"{self.prefix}{namespace}:{what}"

    def _call(self, fn: Any) -> Any:
        try:
            return fn()
        except self._redis_errors as exc:
            raise StoreError(f"redis {self.url}: {exc}") from exc

    def seed(self, namespace: str, token: str, histories: Mapping[str, Timeline]) -> bool:
        def do() -> bool:
            if self.r.get(self._k(namespace, "seeded")) == token:
                return False
            base_key, tmp = self._k(namespace, "base"), self._k(namespace, f"base-{token}")
            self.r.delete(tmp)
            items = list(histories.items())
            for start in range(0, len(items), 5000):
                chunk = {u: json.dumps([[i, _json_ts(t)] for i, t in evs]) for u, evs in items[start : start + 5000]}
                self.r.hset(tmp, mapping=chunk)  # type: ignore[arg-type]
            if not items:
                self.r.delete(base_key)
            else:
                self.r.rename(tmp, base_key)  # readers see the old base or the new one, never half
            live: set[str] = self.r.smembers(self._k(namespace, "live"))  # type: ignore[assignment]
            for user in live:
                key = self._k(namespace, f"ev:{user}")
                held = _held(histories.get(user, []))
                raw: list[str] = self.r.lrange(key, 0, -1)  # type: ignore[assignment]
                kept = [p for p, (i, t) in zip(raw, self._decode(raw), strict=True) if (i, _json_ts(t)) not in held]
                if len(kept) != len(raw):
                    pipe = self.r.pipeline(transaction=True)
                    pipe.delete(key)
                    if kept:
                        pipe.rpush(key, *kept)
                    pipe.execute()
            self.r.set(self._k(namespace, "seeded"), token)
            return True

        return bool(self._call(do))

    @staticmethod
    def _decode(payloads: Sequence[str]) -> Timeline:
        out = []
        for p in payloads:
            item, ts = json.loads(p)
            out.append((str(item), _ts(ts)))
        return out

    def append(self, namespace: str, events: Sequence[Event]) -> list[bool]:
        if not events:
            return []
        args: list[str] = [self._k(namespace, "ev:")]
        for e in events:
            args += [e.event_id, e.user_id, json.dumps([e.item_id, _json_ts(e.timestamp)])]
        keys = [self._k(namespace, "ids"), self._k(namespace, "live")]
        added = self._call(lambda: self._append(keys=keys, args=args))
        return [int(a) == 1 for a in added]

    def events(self, namespace: str, users: Sequence[str]) -> dict[str, Timeline]:
        wanted = list(dict.fromkeys(users))
        if not wanted:
            return {}

        def do() -> list[Any]:
            pipe = self.r.pipeline(transaction=False)
            for u in wanted:
                pipe.lrange(self._k(namespace, f"ev:{u}"), 0, -1)
            return pipe.execute()

        out: dict[str, Timeline] = {}
        for u, raw in zip(wanted, self._call(do), strict=True):
            if raw:
                timeline = self._decode(raw)
                # Arrival order is the list order; a stable sort by time keeps it for equal times.
                out[u] = sorted(timeline, key=lambda e: -math.inf if math.isnan(e[1]) else e[1])
        return out

    def base(self, namespace: str, user: str) -> Timeline:
        raw = self._call(lambda: self.r.hget(self._k(namespace, "base"), user))
        return [(str(i), _ts(t)) for i, t in json.loads(raw)] if raw else []

    def users(self, namespace: str) -> Iterator[str]:
        def do() -> list[str]:
            found: set[str] = set(self.r.hkeys(self._k(namespace, "base")))  # type: ignore[arg-type]
            found |= set(self.r.smembers(self._k(namespace, "live")))  # type: ignore[arg-type]
            return sorted(found)

        return iter(self._call(do))

    def ping(self) -> None:
        self._call(self.r.ping)

    def close(self) -> None:
        self.r.close()


def open_store(kind: str, sqlite_path: Path, redis_url: str, redis_prefix: str = "seqserve:") -> HistoryStore:
    if kind == "sqlite":
        return SQLiteStore(sqlite_path)
    if kind == "redis":
        # Not pinged here: the client reconnects by itself, and /readyz reports while Redis is away.
        return RedisStore(redis_url, redis_prefix)
    raise ValueError(f"unknown history store {kind!r} (sqlite or redis)")
