"""Embedded store: SQLite with a WAL journal, fsync on commit."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from app.store.base import (
    StoreError,
    json_ts,
    nan_ts,
)
from app.store.histories import (
    RECENT_EVENTS,
    Event,
    HistoryStore,
    Outcome,
    StoredEvents,
)
from app.store.state import (
    ARRIVALS_KEEP_S,
    EXPOSURE_BUCKET_S,
    EXPOSURE_KEEP_S,
    ONLINE_KEEP_S,
    WEIGHT_CAP,
    Arrival,
    Candidate,
    Exposure,
    ExposureKey,
    HiddenItem,
    OnlineKey,
    ProductionState,
    RetrainRecord,
    Sums,
    Traffic,
    TrafficKey,
    UserKey,
    UserStats,
    probation_key,
)
from models.queries import LIVE_EVENTS, RecentEvent, Timeline

log = logging.getLogger(__name__)
T = TypeVar("T")
_LIVE = "events INDEXED BY events_live"
# A user's newest `n` live events of one kind (own: received = 0; received steps: 1), newest first: a walk
# of events_live from the user's newest event, whatever the namespace holds for other users.
_NEWEST = (
    f"SELECT item, ts, action, seq FROM {_LIVE} WHERE ns = ? AND user = ? AND received = ? AND folded = 0"
    " ORDER BY ts DESC, seq DESC LIMIT ?"
)


CLOSE_WAIT_S = 15.0  # how long close() waits for calls in flight (a write may wait 10 s on SQLite's busy lock)


class SQLiteStore(HistoryStore, ProductionState):
    """Embedded store: one file, WAL journal, synchronous=FULL so a commit survives a crash."""

    kind = "sqlite"
    local_reads = True
    SCHEMA_VERSION = 11
    _SCHEMA = """
    -- The data hash whose trained events were last dropped, per namespace (column `token`: that hash).
    CREATE TABLE IF NOT EXISTS seeded (ns TEXT PRIMARY KEY, token TEXT NOT NULL, at REAL NOT NULL);
    CREATE TABLE IF NOT EXISTS events (
        seq INTEGER PRIMARY KEY, ns TEXT NOT NULL, event_id TEXT NOT NULL, user TEXT NOT NULL,
        item TEXT NOT NULL, ts REAL, recorded_at REAL NOT NULL,
        folded INTEGER NOT NULL DEFAULT 0,  -- 1: a later base held it (files of the first version)
        action TEXT,
        received INTEGER NOT NULL DEFAULT 0,  -- 1: a step another user's event added (capped apart)
        UNIQUE (ns, event_id));
    -- A user's live events of one kind, newest first: every by-user read and trim walks only its rows
    -- (queries name it with INDEXED BY, so the planner cannot pick a scan of the namespace instead).
    CREATE INDEX IF NOT EXISTS events_live ON events (ns, user, received, ts DESC, seq DESC) WHERE folded = 0;
    -- Everyone's events of a time span (recent activity).
    CREATE INDEX IF NOT EXISTS events_by_time ON events (ns, received, ts);
    -- Every id ever stored, with its payload's digest: kept when an event is folded or trimmed.
    CREATE TABLE IF NOT EXISTS event_ids (ns TEXT, event_id TEXT, digest TEXT NOT NULL,
        PRIMARY KEY (ns, event_id)) WITHOUT ROWID;
    -- The version an admin pinned per model name (absent: the newest that loads).
    CREATE TABLE IF NOT EXISTS pins (name TEXT PRIMARY KEY, version TEXT NOT NULL, at REAL NOT NULL);
    CREATE TABLE IF NOT EXISTS hidden (name TEXT NOT NULL, item TEXT NOT NULL, spec TEXT NOT NULL,
        PRIMARY KEY (name, item));
    CREATE TABLE IF NOT EXISTS named_filters (name TEXT NOT NULL, filter TEXT NOT NULL, spec TEXT NOT NULL,
        PRIMARY KEY (name, filter));
    -- Own events in the order they were stored, for online evaluation (kept ARRIVALS_KEEP_S).
    CREATE TABLE IF NOT EXISTS arrivals (seq INTEGER PRIMARY KEY AUTOINCREMENT, ns TEXT NOT NULL,
        user TEXT NOT NULL, item TEXT NOT NULL, at REAL NOT NULL, recommendation_id TEXT);
    CREATE INDEX IF NOT EXISTS arrivals_by_time ON arrivals (at);
    -- The version tried beside the live one per model name (Candidate as JSON).
    CREATE TABLE IF NOT EXISTS candidates (name TEXT PRIMARY KEY, spec TEXT NOT NULL);
    -- Who holds a deployment-wide lease (the retrainer's) and until when (take_lease).
    CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, until REAL NOT NULL);
    CREATE TABLE IF NOT EXISTS reloads (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL);
    -- Online evaluation sums of every worker and host, per model, version, variant, time bucket and segment.
    CREATE TABLE IF NOT EXISTS online (name TEXT NOT NULL, version TEXT NOT NULL, variant TEXT NOT NULL,
        bucket REAL NOT NULL, segment TEXT NOT NULL, n REAL NOT NULL, hits REAL NOT NULL, ndcg REAL NOT NULL,
        ndcg2 REAL NOT NULL, rr REAL NOT NULL, attributed REAL NOT NULL,
        PRIMARY KEY (name, version, variant, bucket, segment)) WITHOUT ROWID;
    -- What each version showed (Exposure) per bucket of EXPOSURE_BUCKET_S, and which items (coverage).
    CREATE TABLE IF NOT EXISTS exposure (name TEXT NOT NULL, version TEXT NOT NULL, variant TEXT NOT NULL,
        bucket REAL NOT NULL, lists REAL NOT NULL, slots REAL NOT NULL, head REAL NOT NULL,
        PRIMARY KEY (name, version, variant, bucket)) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS exposure_items (name TEXT NOT NULL, bucket REAL NOT NULL, version TEXT NOT NULL,
        variant TEXT NOT NULL, item TEXT NOT NULL, PRIMARY KEY (name, bucket, version, variant, item)) WITHOUT ROWID;
    -- Every worker's answers per model, version and minute: count, 5xx, latency histogram (Traffic, its JSON
    -- object of LATENCY_EDGES_S's index -> count), what probation compares after a promotion.
    CREATE TABLE IF NOT EXISTS traffic (name TEXT NOT NULL, version TEXT NOT NULL, bucket REAL NOT NULL,
        n REAL NOT NULL, errors REAL NOT NULL, hist TEXT NOT NULL, PRIMARY KEY (name, version, bucket)) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS traffic_by_time ON traffic (name, bucket);
    -- A running trial's scored lists per user (the promotion rule's unit), both sides.
    CREATE TABLE IF NOT EXISTS trial_users (name TEXT NOT NULL, trial REAL NOT NULL, version TEXT NOT NULL,
        variant TEXT NOT NULL, user TEXT NOT NULL, n REAL NOT NULL, ndcg REAL NOT NULL,
        PRIMARY KEY (name, trial, version, variant, user)) WITHOUT ROWID;
    -- Each side's running sums over those users (UserStats), moved in the same write as trial_users.
    CREATE TABLE IF NOT EXISTS trial_stats (name TEXT NOT NULL, trial REAL NOT NULL, version TEXT NOT NULL,
        variant TEXT NOT NULL, users REAL NOT NULL, n REAL NOT NULL, s REAL NOT NULL, w REAL NOT NULL,
        wm REAL NOT NULL, w2 REAL NOT NULL, w2m REAL NOT NULL, w2mm REAL NOT NULL, positive REAL NOT NULL,
        negative REAL NOT NULL, PRIMARY KEY (name, trial, version, variant)) WITHOUT ROWID;
    -- The retrainer's record per model (RetrainRecord as JSON): its cooldown and back-off outlive the process.
    CREATE TABLE IF NOT EXISTS retrains (name TEXT PRIMARY KEY, spec TEXT NOT NULL);
    """

    def __init__(self, path: Path, keep: int = LIVE_EVENTS) -> None:
        super().__init__(keep)
        self.path = path
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        # Calls using a connection now: close() waits for them (a worker thread still reading while the service
        # shuts down) rather than close a connection under a call, which can crash the process.
        self._busy = 0
        self._settled = threading.Condition(self._conns_lock)
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
                # (app.live_events.RECEIVED_ID), an id prefix clients may not use.
                conn.execute("UPDATE events SET received = 1 WHERE substr(event_id, 1, 2) = '<-'")
            # Files before version 4 held a copy of every artifact history ("base"): the tables hold them now.
            conn.execute("DROP TABLE IF EXISTS base")
            # Before version 8 by-user reads went through this index, and the planner could prefer a scan of
            # the namespace by time to it (docs/decisions/store-reads.md): events_live replaces it.
            conn.execute("DROP INDEX IF EXISTS events_by_user")
            # Version 9 added the sign counts to trial_stats (rebuilt from trial_users below) and the answer an
            # arrival names; version 11 the users' weighted means in place of the clustered sums.
            conn.execute("DROP TABLE IF EXISTS trial_stats")
            arrival_columns = {r[1] for r in conn.execute("PRAGMA table_info(arrivals)")}
            if arrival_columns and "recommendation_id" not in arrival_columns:
                conn.execute("ALTER TABLE arrivals ADD COLUMN recommendation_id TEXT")
            online_columns = {r[1] for r in conn.execute("PRAGMA table_info(online)")}
            if online_columns and "attributed" not in online_columns:
                conn.execute("ALTER TABLE online ADD COLUMN attributed REAL NOT NULL DEFAULT 0")
            # Version 10 keyed the online sums by segment too: the earlier sums are copied in segment "".
            if online_columns and "segment" not in online_columns:
                conn.execute("ALTER TABLE online RENAME TO online_unsegmented")
            # One statement at a time: executescript() would commit the open transaction first.
            for statement in self._SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            if online_columns and "segment" not in online_columns:
                conn.execute(
                    "INSERT INTO online SELECT name, version, variant, bucket, '', n, hits, ndcg, ndcg2, rr, attributed"
                    " FROM online_unsegmented"
                )
                conn.execute("DROP TABLE online_unsegmented")
            # Trials running across the upgrade: their sides' sums from their users.
            conn.execute(
                "INSERT INTO trial_stats SELECT name, trial, version, variant, COUNT(*), SUM(n), SUM(ndcg), SUM(w),"
                " SUM(w * m), SUM(w * w), SUM(w * w * m), SUM(w * w * m * m), SUM(ndcg > 0), SUM(ndcg < 0) FROM"
                f" (SELECT *, MIN(n, {WEIGHT_CAP}) AS w, ndcg / n AS m FROM trial_users WHERE n > 0)"
                " GROUP BY name, trial, version, variant"
            )
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

    @contextmanager
    def _in_use(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, counted while a call uses it (close() waits for those)."""
        with self._settled:
            self._busy += 1
        try:
            yield self._conn()
        finally:
            with self._settled:
                self._busy -= 1
                self._settled.notify_all()

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in one write transaction. Any failure, the COMMIT's included, rolls back, so the
        connection is never left inside an open transaction that would fail every later write."""
        with self._write_lock, self._in_use() as conn:
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
            with self._in_use() as conn:
                return fn(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    def drop_trained_events(self, namespace: str, data_hash: str, stored: StoredEvents) -> int | None:
        def do(conn: sqlite3.Connection) -> int | None:
            row = conn.execute("SELECT token FROM seeded WHERE ns = ?", (namespace,)).fetchone()
            if row is not None and row[0] == data_hash:
                return None
            dropped = 0
            live = conn.execute(f"SELECT DISTINCT user FROM {_LIVE} WHERE ns = ? AND folded = 0", (namespace,))
            for (user,) in live:
                held = stored(user)
                if held:
                    rows = conn.execute(
                        f"SELECT seq, item, ts FROM {_LIVE} WHERE ns = ? AND user = ? AND folded = 0", (namespace, user)
                    ).fetchall()
                    drop = [(seq,) for seq, item, ts in rows if (item, ts) in held]
                    conn.executemany("DELETE FROM events WHERE seq = ?", drop)  # event_ids keeps their ids
                    dropped += len(drop)
            conn.execute(
                "INSERT OR REPLACE INTO seeded (ns, token, at) VALUES (?, ?, ?)", (namespace, data_hash, time.time())
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
            conn.executemany(
                "INSERT INTO arrivals (ns, user, item, at, recommendation_id) VALUES (?, ?, ?, ?, ?)",
                ((namespace, e.user_id, e.item_id, now, e.recommendation_id) for e in new if not e.received),
            )
            conn.execute("DELETE FROM arrivals WHERE at < ?", (now - ARRIVALS_KEEP_S,))
            for user, received in {(e.user_id, int(e.received)) for e in new}:  # the newest `keep` of each kind
                conn.execute(
                    f"DELETE FROM events WHERE seq IN (SELECT seq FROM {_LIVE} WHERE ns = ? AND user = ?"
                    " AND received = ? AND folded = 0 ORDER BY ts DESC, seq DESC LIMIT -1 OFFSET ?)",
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
            for user in wanted:  # each kind read newest first from the index; merged here, never sorted by SQLite
                own = conn.execute(_NEWEST, (namespace, user, 0, n)).fetchall()
                received = conn.execute(_NEWEST, (namespace, user, 1, n)).fetchall()
                rows = own[::-1] if not received else sorted(own + received, key=_oldest_first)
                if rows:
                    out[user] = [(item, nan_ts(ts), action) for item, ts, action, _ in rows]
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

    def pending(self, namespace: str) -> int:
        row = self._read(
            lambda c: c.execute(
                f"SELECT COUNT(*) FROM {_LIVE} WHERE ns = ? AND received = 0 AND folded = 0", (namespace,)
            ).fetchone()
        )
        return int(row[0])

    def users(self, namespace: str) -> Iterator[str]:
        rows = self._read(
            lambda c: c.execute(
                f"SELECT DISTINCT user FROM {_LIVE} WHERE ns = ? AND folded = 0 ORDER BY 1", (namespace,)
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
                _write_pin(conn, name, version)

        self._write(do)

    def hide(self, name: str, items: Mapping[str, HiddenItem]) -> int:
        def do(conn: sqlite3.Connection) -> int:
            conn.executemany(
                "INSERT INTO hidden (name, item, spec) VALUES (?, ?, ?) ON CONFLICT (name, item) DO UPDATE SET"
                " spec = excluded.spec",
                ((name, item, h.to_json()) for item, h in items.items()),
            )
            return int(conn.execute("SELECT COUNT(*) FROM hidden WHERE name = ?", (name,)).fetchone()[0])

        return self._write(do)

    def unhide(self, name: str, items: Sequence[str]) -> int:
        def do(conn: sqlite3.Connection) -> int:
            before = conn.total_changes
            conn.executemany("DELETE FROM hidden WHERE name = ? AND item = ?", ((name, i) for i in items))
            return conn.total_changes - before

        return self._write(do)

    def set_filter(self, name: str, filter_name: str, spec: str | None) -> None:
        def do(conn: sqlite3.Connection) -> None:
            if spec is None:
                conn.execute("DELETE FROM named_filters WHERE name = ? AND filter = ?", (name, filter_name))
            else:
                conn.execute(
                    "INSERT INTO named_filters (name, filter, spec) VALUES (?, ?, ?) ON CONFLICT (name, filter)"
                    " DO UPDATE SET spec = excluded.spec",
                    (name, filter_name, spec),
                )

        self._write(do)

    def filters(self, name: str) -> dict[str, str]:
        def do(conn: sqlite3.Connection) -> dict[str, str]:
            return dict(conn.execute("SELECT filter, spec FROM named_filters WHERE name = ?", (name,)).fetchall())

        return self._read(do)

    def hidden(self, name: str) -> dict[str, HiddenItem]:
        def do(conn: sqlite3.Connection) -> dict[str, HiddenItem]:
            rows = conn.execute("SELECT item, spec FROM hidden WHERE name = ?", (name,)).fetchall()
            return {item: HiddenItem.from_json(spec) for item, spec in rows}

        return self._read(do)

    def first_cursor(self, since: float) -> str:
        def do(conn: sqlite3.Connection) -> str:
            row = conn.execute("SELECT MIN(seq) FROM arrivals WHERE at >= ?", (since,)).fetchone()
            if row[0] is None:  # none since: the newest's
                return str(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM arrivals").fetchone()[0])
            return str(int(row[0]) - 1)

        return self._read(do)

    def arrivals(self, cursor: str | None, limit: int = 10_000) -> tuple[str, list[Arrival]]:
        if cursor is None:
            last = self._read(lambda c: c.execute("SELECT COALESCE(MAX(seq), 0) FROM arrivals").fetchone()[0])
            return str(last), []
        rows = self._read(
            lambda c: c.execute(
                "SELECT seq, ns, user, item, at, recommendation_id FROM arrivals WHERE seq > ? ORDER BY seq LIMIT ?",
                (int(cursor), limit),
            ).fetchall()
        )
        return (str(rows[-1][0]) if rows else cursor), [
            Arrival(ns, u, i, float(at), rid) for _, ns, u, i, at, rid in rows
        ]

    def add_online(self, sums: Mapping[OnlineKey, Sums]) -> None:
        def do(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO online (name, version, variant, bucket, segment, n, hits, ndcg, ndcg2, rr, attributed)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name, version, variant, bucket, segment)"
                " DO UPDATE SET n = n + excluded.n, hits = hits + excluded.hits, ndcg = ndcg + excluded.ndcg,"
                " ndcg2 = ndcg2 + excluded.ndcg2, rr = rr + excluded.rr, attributed = attributed + excluded.attributed",
                ((*key, *s.values()) for key, s in sums.items()),
            )
            conn.execute("DELETE FROM online WHERE bucket < ?", (time.time() - ONLINE_KEEP_S,))

        if sums:
            self._write(do)

    def online(self, name: str) -> dict[OnlineKey, Sums]:
        rows = self._read(
            lambda c: c.execute(
                "SELECT version, variant, bucket, segment, n, hits, ndcg, ndcg2, rr, attributed FROM online"
                " WHERE name = ?",
                (name,),
            ).fetchall()
        )
        return {(name, v, var, float(b), seg): Sums(*vals) for v, var, b, seg, *vals in rows}

    def add_exposure(self, rows: Mapping[ExposureKey, Exposure]) -> None:
        def do(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO exposure (name, version, variant, bucket, lists, slots, head) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (name, version, variant, bucket) DO UPDATE SET lists = lists + excluded.lists,"
                " slots = slots + excluded.slots, head = head + excluded.head",
                ((*key, e.lists, e.slots, e.head) for key, e in rows.items()),
            )
            conn.executemany(
                "INSERT OR IGNORE INTO exposure_items (name, bucket, version, variant, item) VALUES (?, ?, ?, ?, ?)",
                ((name, b, v, var, item) for (name, v, var, b), e in rows.items() for item in e.items),
            )
            before = time.time() - EXPOSURE_KEEP_S
            for name in {key[0] for key in rows}:  # by the keys' (name, ...) prefix, not a scan of every row
                conn.execute("DELETE FROM exposure WHERE name = ? AND bucket < ?", (name, before))
                conn.execute("DELETE FROM exposure_items WHERE name = ? AND bucket < ?", (name, before))

        if rows:
            self._write(do)

    def exposure(self, name: str, *, since: float) -> dict[tuple[str, str], Exposure]:
        start = since - EXPOSURE_BUCKET_S  # buckets that end after `since`

        def do(c: sqlite3.Connection) -> tuple[list[Any], list[Any]]:
            counts = c.execute(
                "SELECT version, variant, SUM(lists), SUM(slots), SUM(head) FROM exposure"
                " WHERE name = ? AND bucket > ? GROUP BY version, variant",
                (name, start),
            ).fetchall()
            items = c.execute(
                "SELECT DISTINCT version, variant, item FROM exposure_items WHERE name = ? AND bucket > ?",
                (name, start),
            ).fetchall()
            return counts, items

        counts, items = self._read(do)
        out = {(v, var): Exposure(lists, slots, head) for v, var, lists, slots, head in counts}
        for v, var, item in items:
            out.setdefault((v, var), Exposure()).items.add(item)
        return out

    def add_traffic(self, rows: Mapping[TrafficKey, Traffic]) -> None:
        def do(conn: sqlite3.Connection) -> None:
            for (name, version, bucket), t in rows.items():
                old = conn.execute(
                    "SELECT n, errors, hist FROM traffic WHERE name = ? AND version = ? AND bucket = ?",
                    (name, version, bucket),
                ).fetchone()
                total = Traffic()
                if old is not None:
                    total = Traffic(old[0], old[1], {int(i): c for i, c in json.loads(old[2]).items()})
                total.add(t)
                conn.execute(
                    "INSERT OR REPLACE INTO traffic (name, version, bucket, n, errors, hist) VALUES (?, ?, ?, ?, ?, ?)",
                    (name, version, bucket, total.n, total.errors, json.dumps(total.hist)),
                )
            conn.execute("DELETE FROM traffic WHERE bucket < ?", (time.time() - ONLINE_KEEP_S,))

        if rows:
            self._write(do)

    def traffic(self, name: str, *, since: float) -> dict[TrafficKey, Traffic]:
        rows = self._read(
            lambda c: c.execute(
                "SELECT version, bucket, n, errors, hist FROM traffic WHERE name = ? AND bucket >= ?", (name, since)
            ).fetchall()
        )
        return {
            (name, v, float(b)): Traffic(float(n), float(e), {int(i): float(c) for i, c in json.loads(h).items()})
            for v, b, n, e, h in rows
        }

    def add_user_sums(self, sums: Mapping[UserKey, Sequence[float]]) -> None:
        def do(conn: sqlite3.Connection) -> None:
            moved: dict[tuple[str, float, str, str], UserStats] = {}
            for (name, trial, version, variant, user), (dn, ds) in sums.items():
                row = conn.execute(
                    "SELECT n, ndcg FROM trial_users WHERE name = ? AND trial = ? AND version = ? AND variant = ?"
                    " AND user = ?",
                    (name, trial, version, variant, user),
                ).fetchone()
                old = (float(row[0]), float(row[1])) if row is not None else None
                new = (float(dn) + (old[0] if old else 0.0), float(ds) + (old[1] if old else 0.0))
                conn.execute(
                    "INSERT OR REPLACE INTO trial_users (name, trial, version, variant, user, n, ndcg)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (name, trial, version, variant, user, *new),
                )
                moved.setdefault((name, trial, version, variant), UserStats()).move(old, new)
            conn.executemany(
                "INSERT INTO trial_stats (name, trial, version, variant, users, n, s, w, wm, w2, w2m, w2mm, positive,"
                " negative) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (name, trial, version, variant) DO UPDATE SET users = users + excluded.users,"
                " n = n + excluded.n, s = s + excluded.s,"
                " w = w + excluded.w, wm = wm + excluded.wm, w2 = w2 + excluded.w2, w2m = w2m + excluded.w2m,"
                " w2mm = w2mm + excluded.w2mm, positive = positive + excluded.positive,"
                " negative = negative + excluded.negative",
                ((*key, *delta.values()) for key, delta in moved.items()),
            )

        if sums:
            self._write(do)

    def trial_stats(self, name: str, trial: float) -> dict[tuple[str, str], UserStats]:
        rows = self._read(
            lambda c: c.execute(
                "SELECT version, variant, users, n, s, w, wm, w2, w2m, w2mm, positive, negative FROM trial_stats"
                " WHERE name = ? AND trial = ?",
                (name, trial),
            ).fetchall()
        )
        return {
            (v, var): UserStats(int(u), n, s, w, wm, w2, w2m, w2mm, int(pos), int(neg))
            for v, var, u, n, s, w, wm, w2, w2m, w2mm, pos, neg in rows
        }

    def candidates(self) -> dict[str, Candidate]:
        rows = self._read(lambda c: c.execute("SELECT name, spec FROM candidates").fetchall())
        return {name: Candidate.from_json(spec) for name, spec in rows}

    def set_candidate(self, name: str, candidate: Candidate | None) -> None:
        def do(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT spec FROM candidates WHERE name = ?", (name,)).fetchone()
            keep = [candidate.since if candidate is not None else -1.0, probation_key(row[0] if row else None)]
            for table in ("trial_users", "trial_stats"):
                conn.execute(f"DELETE FROM {table} WHERE name = ? AND trial NOT IN (?, ?)", (name, *keep))
            if candidate is None:
                conn.execute("DELETE FROM candidates WHERE name = ?", (name,))
            else:
                conn.execute(
                    "INSERT INTO candidates (name, spec) VALUES (?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec",
                    (name, candidate.to_json()),
                )

        self._write(do)

    def settle(self, name: str, version: str, *, promote: bool) -> bool:
        def do(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT spec FROM candidates WHERE name = ?", (name,)).fetchone()
            cand = Candidate.from_json(row[0]) if row is not None else None
            if cand is None or cand.version != version or not cand.running:
                return False
            pin = conn.execute("SELECT version FROM pins WHERE name = ?", (name,)).fetchone()
            ended = cand.settled(
                promoted=promote, at=time.time(), replaced=pin[0] if promote and pin is not None else None
            )
            conn.execute("UPDATE candidates SET spec = ? WHERE name = ?", (ended.to_json(), name))
            if promote:
                _write_pin(conn, name, version)
            return True

        return self._write(do)

    def roll_back(self, name: str, version: str) -> bool:
        def do(conn: sqlite3.Connection) -> bool:
            cand = self._on_probation(conn, name, version)
            if cand is None:
                return False
            rolled = cand.rolled_back()
            conn.execute("UPDATE candidates SET spec = ? WHERE name = ?", (rolled.to_json(), name))
            assert cand.replaced is not None
            _write_pin(conn, name, cand.replaced)
            return True

        return self._write(do)

    def confirm(self, name: str, version: str) -> bool:
        def do(conn: sqlite3.Connection) -> bool:
            cand = self._on_probation(conn, name, version)
            if cand is None:
                return False
            confirmed = cand.confirmed_at(time.time())
            conn.execute("UPDATE candidates SET spec = ? WHERE name = ?", (confirmed.to_json(), name))
            return True

        return self._write(do)

    @staticmethod
    def _on_probation(conn: sqlite3.Connection, name: str, version: str) -> Candidate | None:
        """The candidate record of `name` when `version` is its promotion on probation (in the open write)."""
        row = conn.execute("SELECT spec FROM candidates WHERE name = ?", (name,)).fetchone()
        cand = Candidate.from_json(row[0]) if row is not None else None
        if cand is None or cand.version != version or not cand.on_probation or cand.replaced is None:
            return None
        return cand

    def retrain_record(self, name: str) -> RetrainRecord:
        row = self._read(lambda c: c.execute("SELECT spec FROM retrains WHERE name = ?", (name,)).fetchone())
        return RetrainRecord.from_json(row[0]) if row is not None else RetrainRecord()

    def set_retrain_record(self, name: str, record: RetrainRecord) -> None:
        self._write(
            lambda c: c.execute(
                "INSERT INTO retrains (name, spec) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET spec = excluded.spec",
                (name, record.to_json()),
            )
        )

    def take_lease(self, name: str, holder: str, *, ttl_s: float, now: float) -> bool:
        def do(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT holder, until FROM leases WHERE name = ?", (name,)).fetchone()
            if row is not None and row[0] != holder and row[1] > now:
                return False
            conn.execute(
                "INSERT OR REPLACE INTO leases (name, holder, until) VALUES (?, ?, ?)", (name, holder, now + ttl_s)
            )
            return True

        return self._write(do)

    def drop_lease(self, name: str, holder: str) -> None:
        self._write(lambda c: c.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder)))

    def reloads(self) -> int:
        row = self._read(lambda c: c.execute("SELECT n FROM reloads WHERE id = 0").fetchone())
        return int(row[0]) if row else 0

    def add_reload(self) -> int:
        def do(conn: sqlite3.Connection) -> int:
            conn.execute("INSERT INTO reloads (id, n) VALUES (0, 1) ON CONFLICT (id) DO UPDATE SET n = n + 1")
            return int(conn.execute("SELECT n FROM reloads WHERE id = 0").fetchone()[0])

        return self._write(do)

    def expire(self, *, now: float) -> None:
        # Arrivals are also trimmed when an event arrives; without events they would stay and grow the
        # file, so the housekeeping tick trims them by time too.
        # A read first: a write transaction is an fsync, which each worker's tick should not cost for nothing.
        before = now - ARRIVALS_KEEP_S
        if self._read(lambda c: c.execute("SELECT 1 FROM arrivals WHERE at < ? LIMIT 1", (before,)).fetchone()):
            self._write(lambda c: c.execute("DELETE FROM arrivals WHERE at < ?", (before,)))

    def ping(self) -> None:
        self._read(lambda c: c.execute("SELECT 1").fetchone())

    def close(self) -> None:
        """Close every thread's connection once no call is using one (at most CLOSE_WAIT_S); a later call
        opens its own again."""
        with self._settled:
            if not self._settled.wait_for(lambda: self._busy == 0, timeout=CLOSE_WAIT_S):
                log.warning("SQLite store closed with %d calls still running", self._busy)
            for conn in self._conns:
                conn.close()
            self._conns.clear()
            self._local = threading.local()


def _oldest_first(row: tuple[str, float | None, str | None, int]) -> tuple[bool, float, int]:
    """SQLite's ascending (ts, seq) order of an events row: a missing time first."""
    return row[1] is not None, row[1] or 0.0, row[3]


def _write_pin(conn: sqlite3.Connection, name: str, version: str) -> None:
    """Pin `name` to `version` inside the caller's write transaction (set_pin, settle)."""
    conn.execute(
        "INSERT INTO pins (name, version, at) VALUES (?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET version = excluded.version, at = excluded.at",
        (name, version, time.time()),
    )
