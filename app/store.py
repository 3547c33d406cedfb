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

import hashlib
import json
import logging
import math
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from models.serving import Timeline

log = logging.getLogger(__name__)
T = TypeVar("T")
# "conflict": the id was stored with another payload. When any event of a call conflicts, the call
# stores nothing: the conflicting ones say "conflict", the others "skipped". "dropped_old": taken (its
# id is known from now on) but older than the `keep` newest of its user, so not kept.
Outcome = Literal["stored", "duplicate", "conflict", "skipped", "dropped_old"]
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

    @property
    def digest(self) -> str:
        """Identifies the payload, so a reused event id with another payload is recognised."""
        payload = json.dumps([self.user_id, self.item_id, _json_ts(self.timestamp), self.action])
        return hashlib.sha256(payload.encode()).hexdigest()[:32]


class StoreError(RuntimeError):
    """The store could not be reached or refused a write: nothing of the call was stored.

    The message is for logs (it may name a file or host); clients get a fixed one.
    """


# Query parameters of a Redis URL that carry no secret; every other value (password=..., which
# redis-py accepts, or anything a later client version reads) is masked in logs.
_PLAIN_PARAMS = frozenset(
    {
        "db",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "retry_on_timeout",
        "health_check_interval",
        "protocol",
        "decode_responses",
        "ssl_cert_reqs",
        "client_name",
    }
)


def redact(url: str) -> str:
    """A URL without its password (in the user part or the query string), for logs."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{port}" if port else "")
    query = (
        "&".join(
            p if p.split("=", 1)[0].lower() in _PLAIN_PARAMS or "=" not in p else f"{p.split('=', 1)[0]}=***"
            for p in parts.query.split("&")
        )
        if parts.query
        else ""
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _ts(t: float | None) -> float:
    return math.nan if t is None else float(t)


def _json_ts(t: float) -> float | None:
    return None if math.isnan(t) else t


def _key(item: str, t: float) -> tuple[str | None, float | None]:
    return item, _json_ts(t)


class HistoryStore(ABC):
    """Per-namespace live user events, appended after an artifact's final histories."""

    kind: str
    # Whether reads are quick local calls (SQLite's WAL readers never wait on a writer) that may run
    # on the event loop when small; a network store's reads always go to a worker thread.
    local_reads: bool = False

    def __init__(self, keep: int = 1000) -> None:
        self.keep = keep  # live events kept per user

    @abstractmethod
    def fold(self, namespace: str, token: str, stored: StoredEvents) -> int | None:
        """Drop the live events that `stored` says the artifact of data hash `token` holds, unless that
        token was folded already (None). Walks the users with live events only; their ids stay known.
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
    def users(self, namespace: str) -> Iterator[str]:
        """Every user with live events."""

    @abstractmethod
    def ping(self) -> None:
        """Raise StoreError when the store cannot be used."""

    @abstractmethod
    def close(self) -> None: ...


class SQLiteStore(HistoryStore):
    """Embedded store: one file, WAL journal, synchronous=FULL so a commit survives a crash."""

    kind = "sqlite"
    local_reads = True
    SCHEMA_VERSION = 4
    _SCHEMA = """
    -- The data hash whose artifact histories were last folded, per namespace.
    CREATE TABLE IF NOT EXISTS seeded (ns TEXT PRIMARY KEY, token TEXT NOT NULL, at REAL NOT NULL);
    CREATE TABLE IF NOT EXISTS events (
        seq INTEGER PRIMARY KEY, ns TEXT NOT NULL, event_id TEXT NOT NULL, user TEXT NOT NULL,
        item TEXT NOT NULL, ts REAL, recorded_at REAL NOT NULL,
        folded INTEGER NOT NULL DEFAULT 0,  -- 1: a later base held it (files of the first version)
        action TEXT,
        received INTEGER NOT NULL DEFAULT 0,  -- 1: a step another user's event added (capped apart)
        UNIQUE (ns, event_id));
    CREATE INDEX IF NOT EXISTS events_by_user ON events (ns, user, ts, seq);
    -- Every id ever stored, with its payload's digest: kept when an event is folded or trimmed.
    CREATE TABLE IF NOT EXISTS event_ids (ns TEXT, event_id TEXT, digest TEXT NOT NULL,
        PRIMARY KEY (ns, event_id)) WITHOUT ROWID;
    """

    def __init__(self, path: Path, keep: int = 1000) -> None:
        super().__init__(keep)
        self.path = path
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._conn()
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{path}: SQLite refused WAL mode (got {mode!r})")
            self._migrate(conn)
        except (sqlite3.Error, OSError) as exc:  # a corrupt or unreadable file: the store is unavailable
            self.close()
            raise StoreError(f"{path}: {exc}") from exc

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Create the schema, or bring a file written by an earlier version up to it."""
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version >= self.SCHEMA_VERSION:
            return
        had_events = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone() is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            columns = {r[1] for r in conn.execute("PRAGMA table_info(events)")} if had_events else set()
            if had_events and "action" not in columns:
                conn.execute("ALTER TABLE events ADD COLUMN action TEXT")
            if had_events and "received" not in columns:
                conn.execute("ALTER TABLE events ADD COLUMN received INTEGER NOT NULL DEFAULT 0")
                # Before this column, the service wrote received steps under ids '<-' + the event's id
                # (app.serving.MIRROR_ID), an id prefix clients may not use.
                conn.execute("UPDATE events SET received = 1 WHERE substr(event_id, 1, 2) = '<-'")
            # Files before version 4 held a copy of every artifact history ("base"): the tables hold them now.
            conn.execute("DROP TABLE IF EXISTS base")
            # One statement at a time: executescript() would commit the open transaction first.
            for statement in self._SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            rows = conn.execute("SELECT ns, event_id, user, item, ts, action FROM events").fetchall()
            conn.executemany(
                "INSERT OR IGNORE INTO event_ids (ns, event_id, digest) VALUES (?, ?, ?)",
                ((ns, eid, Event(eid, u, i, _ts(t), a).digest) for ns, eid, u, i, t, a in rows),
            )
            conn.execute(f"PRAGMA user_version = {self.SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _conn(self) -> sqlite3.Connection:
        """One connection per thread: reads never wait on another thread's fsync."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("PRAGMA busy_timeout=10000")
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from exc
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in one write transaction. Any failure, the COMMIT's included, rolls back, so the
        connection is never left inside an open transaction that would fail every later write."""
        with self._write_lock:
            conn = self._conn()
            try:
                conn.execute("BEGIN IMMEDIATE")
                out = fn(conn)
                conn.execute("COMMIT")
                return out
            except BaseException as exc:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        log.exception("SQLite rollback failed")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"{self.path}: {exc}") from exc
                raise

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return fn(self._conn())
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    def fold(self, namespace: str, token: str, stored: StoredEvents) -> int | None:
        def do(conn: sqlite3.Connection) -> int | None:
            row = conn.execute("SELECT token FROM seeded WHERE ns = ?", (namespace,)).fetchone()
            if row is not None and row[0] == token:
                return None
            dropped = 0
            live = conn.execute("SELECT DISTINCT user FROM events WHERE ns = ? AND folded = 0", (namespace,)).fetchall()
            for (user,) in live:
                held = stored(user)
                if held:
                    rows = conn.execute(
                        "SELECT seq, item, ts FROM events WHERE ns = ? AND user = ? AND folded = 0", (namespace, user)
                    ).fetchall()
                    drop = [(seq,) for seq, item, ts in rows if (item, ts) in held]
                    conn.executemany("DELETE FROM events WHERE seq = ?", drop)  # event_ids keeps their ids
                    dropped += len(drop)
            conn.execute(
                "INSERT OR REPLACE INTO seeded (ns, token, at) VALUES (?, ?, ?)", (namespace, token, time.time())
            )
            return dropped

        return self._write(do)

    def append(self, namespace: str, events: Sequence[Event]) -> list[Outcome]:
        def do(conn: sqlite3.Connection) -> list[Outcome]:
            known: dict[str, str] = {}  # ids stored before or earlier in this call -> digest
            out: list[Outcome] = []
            for e in events:
                if e.event_id not in known:
                    row = conn.execute(
                        "SELECT digest FROM event_ids WHERE ns = ? AND event_id = ?", (namespace, e.event_id)
                    ).fetchone()
                    if row is None:
                        known[e.event_id] = e.digest
                        out.append("stored")
                        continue
                    known[e.event_id] = row[0]
                prev = known[e.event_id]
                out.append("duplicate" if prev in (e.digest, "") else "conflict")
            if "conflict" in out:
                return [o if o == "conflict" else "skipped" for o in out]
            now = time.time()
            new = [e for e, o in zip(events, out, strict=True) if o == "stored"]
            conn.executemany(
                "INSERT INTO event_ids (ns, event_id, digest) VALUES (?, ?, ?)",
                ((namespace, e.event_id, e.digest) for e in new),
            )
            conn.executemany(
                "INSERT OR IGNORE INTO events (ns, event_id, user, item, ts, action, received, recorded_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    (namespace, e.event_id, e.user_id, e.item_id, _json_ts(e.timestamp), e.action, int(e.received), now)
                    for e in new
                ),
            )
            for user, received in {(e.user_id, int(e.received)) for e in new}:  # the newest `keep` of each kind
                conn.execute(
                    "DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE ns = ? AND user = ? AND received = ?"
                    " AND folded = 0 ORDER BY ts DESC, seq DESC LIMIT -1 OFFSET ?)",
                    (namespace, user, received, self.keep),
                )
            kept: set[str] = set()
            ids = [e.event_id for e in new]
            for start in range(0, len(ids), 500):  # SQLite's bound-parameter limit
                chunk = ids[start : start + 500]
                kept |= {
                    r[0]
                    for r in conn.execute(
                        f"SELECT event_id FROM events WHERE ns = ? AND event_id IN ({','.join('?' * len(chunk))})",
                        (namespace, *chunk),
                    )
                }
            return [
                o if o != "stored" or e.event_id in kept else "dropped_old" for e, o in zip(events, out, strict=True)
            ]

        return self._write(do)

    def events(self, namespace: str, users: Sequence[str], limit: int | None = None) -> dict[str, Timeline]:
        wanted = list(dict.fromkeys(users))
        if not wanted:
            return {}
        n = min(limit or self.keep, self.keep)

        def do(conn: sqlite3.Connection) -> dict[str, Timeline]:
            out: dict[str, Timeline] = {}
            for start in range(0, len(wanted), 500):  # SQLite's bound-parameter limit
                chunk = wanted[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    "SELECT user, item, ts, action FROM (SELECT user, item, ts, action, seq, ROW_NUMBER() OVER"
                    " (PARTITION BY user, received ORDER BY ts DESC, seq DESC) AS newest FROM events"
                    f" WHERE ns = ? AND user IN ({marks}) AND folded = 0) WHERE newest <= ? ORDER BY user, ts, seq",
                    (namespace, *chunk, n),
                ).fetchall()
                for user, item, ts, action in rows:
                    out.setdefault(user, []).append((item, _ts(ts), action))
            return out

        return self._read(do)

    def users(self, namespace: str) -> Iterator[str]:
        rows = self._read(
            lambda c: c.execute(
                "SELECT DISTINCT user FROM events WHERE ns = ? AND folded = 0 ORDER BY 1", (namespace,)
            ).fetchall()
        )
        return (u for (u,) in rows)

    def ping(self) -> None:
        self._read(lambda c: c.execute("SELECT 1").fetchone())

    def close(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        self._local = threading.local()


# One call appends many events atomically. First every id's digest is checked (new, same payload, or
# another payload: then nothing is written); then each new event joins its user's sorted set of its
# kind (own events, or received steps; score = time; member = a zero-padded arrival number + payload,
# so equal times keep arrival order), the set is trimmed to `keep`, and an event trimmed at once is
# reported (4: dropped_old).
_APPEND_LUA = """
local prefix, keep, rprefix = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local out, known, conflict, written = {}, {}, false, {}
for n = 4, #ARGV, 6 do
  local id, digest = ARGV[n], ARGV[n + 2]
  local prev = known[id]
  if prev == nil then prev = redis.call('HGET', KEYS[1], id) end
  if not prev then
    known[id] = digest
    out[#out + 1] = 1
  elseif prev == digest or prev == '' then
    out[#out + 1] = 0
  else
    out[#out + 1] = 2
    conflict = true
  end
end
if conflict then
  for i = 1, #out do if out[i] ~= 2 then out[i] = 3 end end
  return out
end
for n = 4, #ARGV, 6 do
  local i = (n - 4) / 6 + 1
  if out[i] == 1 then
    local id, user, digest, score, payload = ARGV[n], ARGV[n + 1], ARGV[n + 2], ARGV[n + 3], ARGV[n + 4]
    redis.call('HSET', KEYS[1], id, digest)
    local seq = redis.call('INCR', KEYS[3])
    local key = (ARGV[n + 5] == '1' and rprefix or prefix) .. user
    local member = string.format('%020d', seq) .. payload
    redis.call('ZADD', key, score, member)
    redis.call('ZREMRANGEBYRANK', key, 0, -(keep + 1))
    written[i] = {key, member}
    redis.call('SADD', KEYS[2], user)
  end
end
for i, km in pairs(written) do
  if not redis.call('ZSCORE', km[1], km[2]) then out[i] = 4 end
end
return out
"""
_OUTCOMES: dict[int, Outcome] = {1: "stored", 0: "duplicate", 2: "conflict", 3: "skipped", 4: "dropped_old"}
_SEQ_WIDTH = 20


class RedisStore(HistoryStore):
    """Redis store for several instances. Keys, under <prefix><ns>: `seeded` (the data hash last folded),
    `eids` (hash event id -> digest), `live` (set of users), `seq`, `z:<user>` (sorted set of the user's
    own events), `r:<user>` (sorted set of the steps it received).

    The append script derives the per-user keys inside it, so this needs one Redis server, not a cluster.
    """

    kind = "redis"

    def __init__(
        self, url: str, prefix: str = "seqserve:", timeout_s: float = 5.0, keep: int = 1000, password: str | None = None
    ) -> None:
        import redis

        super().__init__(keep)
        self._redis_errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self.where = redact(url)
        auth = {"password": password} if password else {}
        try:
            self.r = redis.Redis.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True, **auth
            )
        except (ValueError, TypeError, *self._redis_errors) as exc:  # TypeError: an unknown URL parameter
            raise StoreError(f"redis {self.where}: {type(exc).__name__}") from None
        self.prefix = prefix
        self._append = self.r.register_script(_APPEND_LUA)

    def _k(self, namespace: str, what: str) -> str:
        return f"{self.prefix}{namespace}:{what}"

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except self._redis_errors as exc:
            # redis-py's messages can repeat the connection URL: keep only the redacted one.
            raise StoreError(f"redis {self.where}: {type(exc).__name__}: {str(exc).split(' redis://')[0]}") from None

    def _migrate(self, namespace: str) -> None:
        """Move a namespace written by the previous version (a list per user, a set of ids) to this layout."""
        old_ids = self._k(namespace, "ids")
        if self.r.type(old_ids) == "set":
            for eid in self.r.sscan_iter(old_ids, count=1000):
                self.r.hsetnx(self._k(namespace, "eids"), eid, "")  # "": any payload counts as a duplicate
            self.r.delete(old_ids)
        live: set[str] = self.r.smembers(self._k(namespace, "live"))  # type: ignore[assignment]
        for user in live:
            old = self._k(namespace, f"ev:{user}")
            if self.r.type(old) != "list":
                continue
            payloads: list[str] = self.r.lrange(old, 0, -1)  # type: ignore[assignment]
            for payload in payloads:
                item, ts = json.loads(payload)[:2]
                seq = self.r.incr(self._k(namespace, "seq"))
                self.r.zadd(
                    self._k(namespace, f"z:{user}"),
                    {f"{seq:0{_SEQ_WIDTH}d}{json.dumps([item, ts, None])}": _score(_ts(ts))},
                )
            self.r.delete(old)
        # Earlier versions kept a copy of every artifact history here; the tables hold them now.
        self.r.unlink(self._k(namespace, "base"))

    def fold(self, namespace: str, token: str, stored: StoredEvents) -> int | None:
        def do() -> int | None:
            self._migrate(namespace)
            if self.r.get(self._k(namespace, "seeded")) == token:
                return None
            dropped = 0
            for user in self.r.sscan_iter(self._k(namespace, "live"), count=1000):
                held = stored(user)
                if not held:
                    continue
                for key in (self._k(namespace, f"z:{user}"), self._k(namespace, f"r:{user}")):
                    members: list[str] = self.r.zrange(key, 0, -1)  # type: ignore[assignment]
                    folded = [m for m in members if _key(*_decode(m)[:2]) in held]
                    if folded:
                        # Removing these members only: events appended meanwhile are untouched.
                        dropped += int(self.r.zrem(key, *folded))
            self.r.set(self._k(namespace, "seeded"), token)
            return dropped

        return self._call(do)

    def append(self, namespace: str, events: Sequence[Event]) -> list[Outcome]:
        if not events:
            return []
        args: list[str | int | float] = [self._k(namespace, "z:"), self.keep, self._k(namespace, "r:")]
        for e in events:
            args += [
                e.event_id,
                e.user_id,
                e.digest,
                _score(e.timestamp),
                json.dumps([e.item_id, _json_ts(e.timestamp), e.action]),
                int(e.received),
            ]
        keys = [self._k(namespace, "eids"), self._k(namespace, "live"), self._k(namespace, "seq")]
        codes = self._call(lambda: self._append(keys=keys, args=args))
        return [_OUTCOMES[int(c)] for c in codes]

    def events(self, namespace: str, users: Sequence[str], limit: int | None = None) -> dict[str, Timeline]:
        wanted = list(dict.fromkeys(users))
        if not wanted:
            return {}
        n = min(limit or self.keep, self.keep)

        def do() -> list[Any]:
            pipe = self.r.pipeline(transaction=False)
            for u in wanted:
                pipe.zrange(self._k(namespace, f"z:{u}"), -n, -1, withscores=True)
                pipe.zrange(self._k(namespace, f"r:{u}"), -n, -1, withscores=True)
            return pipe.execute()

        found = self._call(do)
        out: dict[str, Timeline] = {}
        for k, u in enumerate(wanted):
            members = found[2 * k] + found[2 * k + 1]
            if members:
                members.sort(key=lambda ms: (ms[1], ms[0][:_SEQ_WIDTH]))  # time, then arrival
                out[u] = [_decode(m) for m, _ in members]
        return out

    def users(self, namespace: str) -> Iterator[str]:
        def do() -> list[str]:
            return sorted(self.r.smembers(self._k(namespace, "live")))  # type: ignore[arg-type]

        return iter(self._call(do))

    def ping(self) -> None:
        self._call(self.r.ping)

    def close(self) -> None:
        self.r.close()


def _score(t: float) -> str:
    return "-inf" if math.isnan(t) else repr(float(t))


def _decode(member: str) -> tuple[str, float, str | None]:
    item, ts, action = json.loads(member[_SEQ_WIDTH:])
    return str(item), _ts(ts), action


def open_store(
    kind: str,
    *,
    sqlite_path: Path,
    redis_url: str,
    redis_prefix: str = "seqserve:",
    keep: int = 1000,
    redis_password: str | None = None,
) -> HistoryStore:
    if kind == "sqlite":
        return SQLiteStore(sqlite_path, keep=keep)
    if kind == "redis":
        # Not pinged here: the client reconnects by itself, and /readyz reports while Redis is away.
        return RedisStore(redis_url, redis_prefix, keep=keep, password=redis_password)
    raise ValueError(f"unknown history store {kind!r} (sqlite or redis)")
