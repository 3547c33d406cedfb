"""Both history stores behave the same: seeding, idempotent appends, ordering, re-seeding."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.store import Event, HistoryStore, RedisStore, SQLiteStore, StoreError, open_store


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HistoryStore]:
    s: HistoryStore
    if request.param == "sqlite":
        s = SQLiteStore(tmp_path / "h.sqlite3")
    else:
        srv = request.getfixturevalue("redis_server")
        s = RedisStore(srv.url)
    yield s
    s.close()


BASE = {"u1": [("a", 10.0), ("b", 20.0)], "u2": [("c", math.nan)]}


def test_seed_once_per_token(store: HistoryStore) -> None:
    assert store.seed("ml", "hash1", BASE)
    assert not store.seed("ml", "hash1", {"other": [("z", 1.0)]})  # same data: nothing rewritten
    assert store.base("ml", "u1") == [("a", 10.0), ("b", 20.0)]
    assert store.base("ml", "other") == []
    [(item, t)] = store.base("ml", "u2")
    assert item == "c" and math.isnan(t)
    assert store.base("beauty", "u1") == []  # namespaces are separate


def test_append_is_idempotent_and_ordered(store: HistoryStore) -> None:
    store.seed("ml", "h", BASE)
    first = store.append("ml", [Event("e1", "u1", "x", 30.0), Event("e2", "u1", "y", 25.0),
                                Event("e1", "u1", "x", 30.0)])
    assert first == [True, True, False]  # a repeat inside one call is a duplicate too
    assert store.append("ml", [Event("e2", "u1", "y", 25.0), Event("e3", "new", "q", 1.0)]) == [False, True]
    live = store.events("ml", ["u1", "new", "nobody"])
    assert live == {"u1": [("y", 25.0), ("x", 30.0)], "new": [("q", 1.0)]}  # by time, not arrival
    assert store.history("ml", "u1") == [("a", 10.0), ("b", 20.0), ("y", 25.0), ("x", 30.0)]
    assert sorted(store.users("ml")) == ["new", "u1", "u2"]
    assert store.events("other-ns", ["u1"]) == {}
    # The same event id in another namespace is another event.
    assert store.append("other-ns", [Event("e1", "u1", "x", 30.0)]) == [True]


def test_equal_times_keep_arrival_order(store: HistoryStore) -> None:
    store.append("ml", [Event(f"e{n}", "u", item, 5.0) for n, item in enumerate("pqrs")])
    assert [i for i, _ in store.events("ml", ["u"])["u"]] == list("pqrs")


def test_reseed_drops_events_the_new_base_holds(store: HistoryStore) -> None:
    store.seed("ml", "v1", BASE)
    store.append("ml", [Event("e1", "u1", "x", 30.0), Event("e2", "u1", "y", 40.0)])
    # Retrained on data that includes e1: the new base holds it, so it must not count twice.
    store.seed("ml", "v2", {"u1": [*BASE["u1"], ("x", 30.0)]})
    assert store.history("ml", "u1") == [("a", 10.0), ("b", 20.0), ("x", 30.0), ("y", 40.0)]
    assert store.base("ml", "u2") == []  # the new base replaced the old one
    # Replaying e1 is still a no-op: its id stays known.
    assert store.append("ml", [Event("e1", "u1", "x", 30.0)]) == [False]


def test_many_users_in_one_read(store: HistoryStore) -> None:
    store.append("ml", [Event(f"e{n}", f"u{n}", "i", float(n)) for n in range(1200)])
    live = store.events("ml", [f"u{n}" for n in range(1200)])
    assert len(live) == 1200 and live["u1199"] == [("i", 1199.0)]


def test_unreachable_redis_raises_store_error() -> None:
    from tests.servers import free_port

    s = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
    with pytest.raises(StoreError):
        s.ping()
    with pytest.raises(StoreError):
        s.append("ml", [Event("e", "u", "i", 1.0)])


def test_unknown_store_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown history store"):
        open_store("mongo", tmp_path / "x", "redis://127.0.0.1:1/0")


def test_sqlite_is_in_wal_mode(tmp_path: Path) -> None:
    import sqlite3

    SQLiteStore(tmp_path / "h.sqlite3").close()
    with sqlite3.connect(tmp_path / "h.sqlite3") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
