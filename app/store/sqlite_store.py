"""Embedded store: SQLite with a WAL journal, fsync on commit."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from app.store.base import (
    RECENT_EVENTS,
    Event,
    HistoryStore,
    Outcome,
    StoredEvents,
    StoreError,
    json_ts,
    nan_ts,
)
from models.serving import LIVE_EVENTS, RecentEvent, Timeline

log = logging.getLogger(__name__)
T = TypeVar("T")


class SQLiteStore(HistoryStore):
    """Embedded store: one file, WAL journal, synchronous=FULL so a commit survives a crash."""

    kind = "sqlite"
    local_reads = True
    SCHEMA_VERSION = 6
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
    -- Everyone's events of a time span (recent activity).
    CREATE INDEX IF NOT EXISTS events_by_time ON events (ns, received, ts);
    -- Every id ever stored, with its payload's digest: kept when an event is folded or trimmed.
    CREATE TABLE IF NOT EXISTS event_ids (ns TEXT, event_id TEXT, digest TEXT NOT NULL,
        PRIMARY KEY (ns, event_id)) WITHOUT ROWID;
    -- The version an admin pinned per model name (absent: the newest that loads).
    CREATE TABLE IF NOT EXISTS pins (name TEXT PRIMARY KEY, version TEXT NOT NULL, at REAL NOT NULL);
    """

    def __init__(self, path: Path, keep: int = LIVE_EVENTS) -> None:
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
                ((ns, eid, Event(eid, u, i, nan_ts(t), a).digest) for ns, eid, u, i, t, a in rows),
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
                    (namespace, e.event_id, e.user_id, e.item_id, json_ts(e.timestamp), e.action, int(e.received), now)
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
                    out.setdefault(user, []).append((item, nan_ts(ts), action))
            return out

        return self._read(do)

    def recent(self, namespace: str, *, start: float, end: float, limit: int = RECENT_EVENTS) -> list[RecentEvent]:
        rows = self._read(
            lambda c: c.execute(
                "SELECT user, item, ts, action FROM events WHERE ns = ? AND received = 0 AND folded = 0 AND ts >= ?"
                " AND ts < ? ORDER BY ts DESC, seq DESC LIMIT ?",
                (namespace, start, end, limit + 1),
            ).fetchall()
        )
        if len(rows) > limit:
            log.warning(
                "recent activity: more than %d live events in %s; the newest %d counted", limit, namespace, limit
            )
        return [(u, i, float(t), a) for u, i, t, a in reversed(rows[:limit])]

    def users(self, namespace: str) -> Iterator[str]:
        rows = self._read(
            lambda c: c.execute(
                "SELECT DISTINCT user FROM events WHERE ns = ? AND folded = 0 ORDER BY 1", (namespace,)
            ).fetchall()
        )
        return (u for (u,) in rows)

    def pins(self) -> dict[str, str]:
        def do(conn: sqlite3.Connection) -> dict[str, str]:
            return {name: version for name, version in conn.execute("SELECT name, version FROM pins")}

        return self._read(do)

    def set_pin(self, name: str, version: str | None) -> None:
        def do(conn: sqlite3.Connection) -> None:
            if version is None:
                conn.execute("DELETE FROM pins WHERE name = ?", (name,))
            else:
                conn.execute(
                    "INSERT INTO pins (name, version, at) VALUES (?, ?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET version = excluded.version, at = excluded.at",
                    (name, version, time.time()),
                )

        self._write(do)

    def ping(self) -> None:
        self._read(lambda c: c.execute("SELECT 1").fetchone())

    def close(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        self._local = threading.local()
