"""The history store interface, the same on both backends: dropping trained events, idempotent appends,
conflicts, bounds, ordering; and each backend's own faults and migrations."""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.store import (
    Event,
    HistoryStore,
    RedisStore,
    SQLiteStore,
    StoredEvents,
    StoreError,
    open_store,
    redact,
)


def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HistoryStore]:
    s: HistoryStore
    if request.param == "sqlite":
        s = SQLiteStore(tmp_path / "h.sqlite3", keep=5)
    else:
        srv = request.getfixturevalue("redis_server")
        s = RedisStore(srv.url, keep=5)
    yield s
    s.close()


def held(table: dict[str, set[tuple[str | None, float | None]]]) -> StoredEvents:
    return lambda user: table.get(user, set())


def test_fold_drops_what_the_artifact_holds_once_per_token(histories: HistoryStore) -> None:
    histories.append(
        "ml", [Event("e1", "u1", "x", 30.0), Event("e2", "u1", "y", 40.0), Event("e3", "u2", "z", math.nan)]
    )
    histories.append("beauty", [Event("e1", "u1", "x", 30.0), Event("<-e1", "u9", "u1", 30.0, received=True)])
    assert (histories.pending("ml"), histories.pending("beauty"), histories.pending("none")) == (3, 1, 0)
    # Retrained on data that includes e1 and e3: the artifact holds them, so they must not count twice.
    assert histories.drop_trained_events("ml", "v1", held({"u1": {("x", 30.0), ("y", 41.0)}, "u2": {("z", None)}})) == 2
    assert histories.pending("ml") == 1  # what a retrain would add
    assert histories.events("ml", ["u1", "u2"]) == {"u1": [("y", 40.0, None)]}
    assert histories.drop_trained_events("ml", "v1", held({"u1": {("y", 40.0)}})) is None  # same data: nothing done
    assert histories.events("ml", ["u1"]) == {"u1": [("y", 40.0, None)]}
    assert histories.events("beauty", ["u1"]) == {"u1": [("x", 30.0, None)]}  # namespaces are separate
    # Replaying e1 is still a no-op: its id stays known.
    assert histories.append("ml", [Event("e1", "u1", "x", 30.0)]) == ["duplicate"]
    assert histories.drop_trained_events("ml", "v2", held({})) == 0


def test_append_is_idempotent_and_ordered(histories: HistoryStore) -> None:
    first = histories.append(
        "ml", [Event("e1", "u1", "x", 30.0), Event("e2", "u1", "y", 25.0, "a2q"), Event("e1", "u1", "x", 30.0)]
    )
    assert first == ["stored", "stored", "duplicate"]  # a repeat inside one call is a duplicate too
    assert histories.append("ml", [Event("e2", "u1", "y", 25.0, "a2q"), Event("e3", "new", "q", 1.0)]) == [
        "duplicate",
        "stored",
    ]
    live = histories.events("ml", ["u1", "new", "nobody"])
    assert live == {"u1": [("y", 25.0, "a2q"), ("x", 30.0, None)], "new": [("q", 1.0, None)]}  # by time
    assert sorted(histories.users("ml")) == ["new", "u1"]
    assert histories.events("other-ns", ["u1"]) == {}
    # The same event id in another namespace is another event.
    assert histories.append("other-ns", [Event("e1", "u1", "x", 30.0)]) == ["stored"]
    assert histories.append("ml", [Event("e1", "u1", "x", 30.0), Event("e9", "u1", "z", 40.0)]) == [
        "duplicate",
        "stored",
    ]


def test_reused_id_with_another_payload_stores_nothing(histories: HistoryStore) -> None:
    histories.append("ml", [Event("e1", "u1", "x", 30.0)])
    out = histories.append("ml", [Event("e2", "u1", "y", 31.0), Event("e1", "u1", "CHANGED", 30.0)])
    assert out == ["skipped", "conflict"]
    assert histories.events("ml", ["u1"]) == {"u1": [("x", 30.0, None)]}  # e2 was not stored either
    assert histories.append("ml", [Event("e2", "u1", "y", 31.0)]) == ["stored"]  # its id was not taken
    # Inside one call too: the second e5 differs from the first.
    assert histories.append("ml", [Event("e5", "u1", "p", 1.0), Event("e5", "u1", "q", 1.0)]) == ["skipped", "conflict"]


def test_equal_times_keep_arrival_order(histories: HistoryStore) -> None:
    histories.append("ml", [Event(f"e{n}", "u", item, 5.0) for n, item in enumerate("pqrs")])
    assert [i for i, _, _ in histories.events("ml", ["u"])["u"]] == list("pqrs")


def test_each_user_keeps_and_reads_only_the_newest(histories: HistoryStore) -> None:
    # keep=5: older events are dropped on write (their ids stay known), reads take the newest `limit`.
    histories.append("ml", [Event(f"e{n}", "u", f"i{n}", float(n)) for n in range(8)])
    histories.append("ml", [Event("old", "u", "ancient", -1.0)])  # older than all it keeps: dropped at once
    assert [i for i, _, _ in histories.events("ml", ["u"])["u"]] == ["i3", "i4", "i5", "i6", "i7"]
    assert [i for i, _, _ in histories.events("ml", ["u"], limit=2)["u"]] == ["i6", "i7"]
    assert histories.pending("ml") == 5  # what is kept, what an export gives
    assert histories.append("ml", [Event("e0", "u", "i0", 0.0)]) == ["duplicate"]


def test_many_users_in_one_read(histories: HistoryStore) -> None:
    histories.append("ml", [Event(f"e{n}", f"u{n}", "i", float(n)) for n in range(1200)])
    live = histories.events("ml", [f"u{n}" for n in range(1200)])
    assert len(live) == 1200 and live["u1199"] == [("i", 1199.0, None)]


def test_unreachable_redis_raises_store_error_without_the_password() -> None:
    from tests.servers import free_port

    s = RedisStore(f"redis://:hunter2@127.0.0.1:{free_port()}/0", timeout_s=0.5)
    with pytest.raises(StoreError) as err:
        s.ping()
    assert "hunter2" not in str(err.value) and "***" in str(err.value)
    with pytest.raises(StoreError):
        s.append("ml", [Event("e", "u", "i", 1.0)])
    assert redact("redis://user:pw@h:6379/0") == "redis://user:***@h:6379/0"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"


def test_a_password_in_the_query_string_is_redacted() -> None:
    """redis-py takes ?password=...; no log line or error may show it."""
    from tests.servers import free_port

    for url in (
        f"redis://127.0.0.1:{free_port()}/0?password=hunter2",
        f"redis://127.0.0.1:{free_port()}/0?db=0&password=hunter2&socket_timeout=1",
    ):
        assert "hunter2" not in redact(url) and "***" in redact(url)
        s = RedisStore(url, timeout_s=0.5)
        with pytest.raises(StoreError) as err:
            s.ping()
        assert "hunter2" not in str(err.value)
    assert redact("redis://h:6379/0?db=2&socket_timeout=3") == "redis://h:6379/0?db=2&socket_timeout=3"


def test_unknown_store_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown history store"):
        open_store("mongo", sqlite_path=tmp_path / "x", redis_url="redis://127.0.0.1:1/0")


def test_sqlite_close_waits_for_a_call_in_flight_and_the_store_opens_again(tmp_path: Path) -> None:
    """A worker thread still reading when the service shuts down: close() waits for it rather than close
    the connection under it (which can crash the process); a later call opens its own connection."""
    s = SQLiteStore(tmp_path / "h.sqlite3")
    inside, release = threading.Event(), threading.Event()
    got: list[object] = []

    def slow_read(conn: sqlite3.Connection) -> int:
        inside.set()
        release.wait(10)
        return int(conn.execute("SELECT 7").fetchone()[0])

    reader = threading.Thread(target=lambda: got.append(s._read(slow_read)))
    reader.start()
    assert inside.wait(10)
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # waiting for the read
    release.set()
    reader.join(10)
    closer.join(10)
    assert got == [7] and not closer.is_alive()
    assert s.pins() == {}  # opens again
    s.close()


def test_sqlite_is_in_wal_mode(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "h.sqlite3").close()
    with sqlite3.connect(tmp_path / "h.sqlite3") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_corrupt_sqlite_file_is_a_store_error(tmp_path: Path) -> None:
    p = tmp_path / "h.sqlite3"
    p.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="not a database"):
        SQLiteStore(p)


def test_failed_commit_rolls_back_and_later_writes_work(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "h.sqlite3")
    s.append("ml", [Event("ok", "u", "i", 1.0)])
    real = s._conn

    class FailingCommit:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn = conn

        def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("disk I/O error")
            return self.conn.execute(sql, *args)

        def __getattr__(self, name: str) -> object:
            return getattr(self.conn, name)

    s._conn = lambda: FailingCommit(real())  # type: ignore[assignment, return-value]
    with pytest.raises(StoreError, match="disk I/O error"):
        s.append("ml", [Event("lost", "u", "j", 2.0)])
    s._conn = real  # type: ignore[method-assign]
    assert not real().in_transaction  # rolled back: the connection is usable
    assert s.append("ml", [Event("next", "u", "k", 3.0)]) == ["stored"]
    assert s.events("ml", ["u"])["u"] == [("i", 1.0, None), ("k", 3.0, None)]  # "lost" was rolled back
    s.close()


def test_sqlite_file_of_the_first_version_is_migrated(tmp_path: Path) -> None:
    p = tmp_path / "old.sqlite3"
    with sqlite3.connect(p) as conn:  # the schema the first version wrote
        conn.executescript("""
        CREATE TABLE seeded (ns TEXT PRIMARY KEY, token TEXT NOT NULL, at REAL NOT NULL);
        CREATE TABLE base (ns TEXT, user TEXT, items TEXT NOT NULL, PRIMARY KEY (ns, user)) WITHOUT ROWID;
        CREATE TABLE events (seq INTEGER PRIMARY KEY, ns TEXT NOT NULL, event_id TEXT NOT NULL, user TEXT NOT NULL,
            item TEXT NOT NULL, ts REAL, recorded_at REAL NOT NULL, folded INTEGER NOT NULL DEFAULT 0,
            UNIQUE (ns, event_id));
        INSERT INTO base VALUES ('ml', 'u1', '[["a", 1.0]]');
        INSERT INTO events (ns, event_id, user, item, ts, recorded_at) VALUES ('ml', 'old1', 'u1', 'x', 5.0, 0);
        """)
    s = SQLiteStore(p)
    assert s.events("ml", ["u1"]) == {"u1": [("x", 5.0, None)]}
    with sqlite3.connect(p) as conn:  # the copy of the artifacts' histories is gone: their tables hold them
        assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'base'").fetchone() is None
    assert s.append("ml", [Event("old1", "u1", "x", 5.0), Event("new", "u1", "y", 6.0, "c2a")]) == [
        "duplicate",
        "stored",
    ]
    assert s.append("ml", [Event("old1", "u1", "CHANGED", 5.0)]) == ["conflict"]
    s.close()


def test_redis_layout_of_the_first_version_is_migrated(redis_server: object) -> None:
    import redis

    url = redis_server.url  # type: ignore[attr-defined]
    r = redis.Redis.from_url(url, decode_responses=True)
    r.sadd("seqserve:ml:ids", "old1")
    r.sadd("seqserve:ml:live", "u1")
    r.rpush("seqserve:ml:ev:u1", json.dumps(["x", 5.0]), json.dumps(["y", None]))
    r.hset("seqserve:ml:base", "u1", '[["a", 1.0]]')
    s = RedisStore(url)
    assert s.drop_trained_events("ml", "h1", held({})) == 0
    assert not r.exists("seqserve:ml:base")
    (y, ty, _), x = s.events("ml", ["u1"])["u1"]
    assert y == "y" and math.isnan(ty) and x == ("x", 5.0, None)  # no time sorts first
    assert s.append("ml", [Event("old1", "u1", "anything", 9.0)]) == ["duplicate"]  # digest unknown: a no-op
    s.close()


def test_received_steps_are_capped_apart_from_own_events(histories: HistoryStore) -> None:
    own = [Event(f"o{n}", "v", f"i{n}", 100.0 + n) for n in range(3)]
    assert histories.append("soc", own) == ["stored"] * 3
    flood = [Event(f"<-x{n}", "v", "attacker", 200.0 + n, "<-c2q", received=True) for n in range(12)]
    assert histories.append("soc", flood) == ["dropped_old"] * 7 + ["stored"] * 5  # what the call's end keeps
    got = histories.events("soc", ["v"])["v"]
    assert [i for i, _, _ in got[:3]] == ["i0", "i1", "i2"]  # all own events kept (keep=5 each kind)
    assert [t for _, t, _ in got[3:]] == [207.0, 208.0, 209.0, 210.0, 211.0]  # newest 5 received, in time order
    assert [t for _, t, _ in histories.events("soc", ["v"], limit=2)["v"]] == [101.0, 102.0, 210.0, 211.0]


def test_an_event_trimmed_in_its_own_write_is_dropped_old(histories: HistoryStore) -> None:
    histories.append("ml", [Event(f"e{n}", "u", "i", 100.0 + n) for n in range(5)])
    out = histories.append("ml", [Event("old", "u", "j", 1.0), Event("new", "u", "k", 500.0)])
    assert out == ["dropped_old", "stored"]
    assert [i for i, _, _ in histories.events("ml", ["u"])["u"]] == ["i", "i", "i", "i", "k"]
    assert histories.append("ml", [Event("old", "u", "j", 1.0)]) == ["duplicate"]  # its id is known


def test_recent_reads_every_users_own_events_of_a_span(histories: HistoryStore) -> None:
    histories.append(
        "soc",
        [
            Event("a", "u1", "v1", 100.0, "c2q"),
            Event("b", "u2", "v1", 150.0, "a2q"),
            Event("<-b", "v1", "u2", 150.0, "<-a2q", received=True),  # a received step: not counted again
            Event("c", "u3", "v2", 200.0, "c2q"),
            Event("d", "u1", "v3", 250.0, "c2q"),
        ],
    )
    histories.append("other", [Event("a", "u1", "v1", 120.0, "c2q")])
    assert histories.recent("soc", start=100.0, end=250.0) == [
        ("u1", "v1", 100.0, "c2q"),
        ("u2", "v1", 150.0, "a2q"),
        ("u3", "v2", 200.0, "c2q"),
    ]
    assert histories.recent("soc", start=100.0, end=251.0, limit=2) == [
        ("u3", "v2", 200.0, "c2q"),
        ("u1", "v3", 250.0, "c2q"),
    ]
    assert histories.recent("soc", start=300.0, end=400.0) == []
    # Folded into a new artifact: counted from its log from now on, so no longer here.
    assert histories.drop_trained_events("soc", "v1", held({"u1": {("v1", 100.0)}})) == 1
    assert [e[0] for e in histories.recent("soc", start=0.0, end=1e9)] == ["u2", "u3", "u1"]


def test_redis_keeps_a_week_of_recent_events(redis_server: object) -> None:
    s = RedisStore(redis_server.url, keep=5)  # type: ignore[attr-defined]
    week = 7 * 24 * 3600.0
    s.append("soc", [Event("old", "u1", "v1", 1000.0, "c2q"), Event("mid", "u2", "v1", 2000.0, "c2q")])
    s.append("soc", [Event("new", "u3", "v1", 1500.0 + week, "c2q")])
    assert [e[0] for e in s.recent("soc", start=0.0, end=1e12)] == ["u2", "u3"]
    assert [i for i, _, _ in s.events("soc", ["u1"])["u1"]] == ["v1"]  # the user's own history keeps it
    s.close()


def test_redis_recent_horizon_follows_the_setting(redis_server: object) -> None:
    """A slow network's windows span weeks: the horizon is SEQSERVE_RECENT_KEEP_S, not a fixed week."""
    month = 30 * 24 * 3600.0
    s = RedisStore(redis_server.url, prefix="wide:", keep=5, recent_keep_s=2 * month)  # type: ignore[attr-defined]
    s.append("soc", [Event("old", "u1", "v1", 1000.0, "c2q"), Event("new", "u3", "v1", 1000.0 + month, "c2q")])
    assert s.recent_horizon_s == 2 * month
    assert [e[0] for e in s.recent("soc", start=0.0, end=1e12)] == ["u1", "u3"]  # a week would have dropped u1
    s.close()


def _vm_steps(s: SQLiteStore, call: Callable[[], object]) -> int:
    """SQLite virtual-machine steps `call` takes on this thread's connection: a cost that does not vary
    with the machine's speed."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn = s._conn()
    conn.set_progress_handler(count, 1)
    try:
        call()
    finally:
        conn.set_progress_handler(None, 1)
    return steps


def test_a_sqlite_by_user_read_costs_the_same_whatever_other_users_hold(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "h.sqlite3", keep=50)
    s.append("ml", [Event("me1", "me", "a", 1.0), Event("me2", "me", "b", 2.0)])
    heavy = [Event(f"h{n}", "heavy", f"i{n}", float(n)) for n in range(200)]
    s.append("ml", heavy)
    read = _vm_steps(s, lambda: s.events("ml", ["me"]))
    read_heavy = _vm_steps(s, lambda: s.events("ml", ["heavy"]))
    trim = _vm_steps(s, lambda: s.append("ml", [Event("me3", "me", "c", 3.0)]))
    for start in range(0, 5_000, 500):  # 5,000 events of 1,000 other users, the same namespace, newer times
        s.append("ml", [Event(f"o{n}", f"other{n % 1000}", f"i{n}", 10.0 + n) for n in range(start, start + 500)])
    assert s.events("ml", ["me"]) == {"me": [("a", 1.0, None), ("b", 2.0, None), ("c", 3.0, None)]}
    assert _vm_steps(s, lambda: s.events("ml", ["me3"])) <= read  # no such user: nothing walked
    assert _vm_steps(s, lambda: s.events("ml", ["me"])) <= read * 1.5  # one row more than before
    assert _vm_steps(s, lambda: s.events("ml", ["heavy"])) <= read_heavy  # only its newest `keep`
    assert _vm_steps(s, lambda: s.append("ml", [Event("me4", "me", "d", 4.0)])) <= trim * 1.5
    s.close()
