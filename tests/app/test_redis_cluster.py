"""The Redis Cluster store's own behaviour: where keys live, calls that span buckets, a primary killed
under an event load. (The store contract itself runs on it in test_store.py and test_store_state.py.)"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.store import Event, RedisClusterStore, StoreError, open_store
from tests.servers import redis_cluster_nodes, wait_until


def test_every_key_of_a_bucket_and_every_production_key_is_in_one_slot(redis_cluster: object) -> None:
    import redis

    s = RedisClusterStore(redis_cluster.url, keep=5, buckets=4)  # type: ignore[attr-defined]
    users = [f"u{n}" for n in range(40)]
    s.append("ml", [Event(f"e{n}", u, "i", float(n)) for n, u in enumerate(users)])
    s.set_pin("m", "v1")
    s.add_user_sums({("m", 1.5, "v1", "live", "u1"): (1.0, 0.5)})
    slot = redis.cluster.key_slot
    keys = [str(k) for k in s.r.scan_iter(count=1000)]
    by_slot: dict[int, set[str]] = {}
    for k in keys:
        by_slot.setdefault(slot(k.encode()), set()).add(k)
    for b in range(4):  # a bucket: its users' events, its id table, users, counter, recent set, arrivals
        mine = {k for k in keys if k.startswith(f"{{seqserve:b{b}}}")}
        assert mine and len({slot(k.encode()) for k in mine}) == 1
        assert {f"{{seqserve:b{b}}}arrivals", f"{{seqserve:b{b}}}ml:eids"} <= mine
    assert len({slot(k.encode()) for k in keys if k.startswith("{seqserve:state}")}) == 1
    assert {s.bucket(u) for u in users} == {0, 1, 2, 3}  # the users spread over every bucket
    s.close()


def test_a_conflict_in_one_bucket_stores_nothing_of_the_call_in_any(redis_cluster: object) -> None:
    s = RedisClusterStore(redis_cluster.url, keep=5, buckets=16)  # type: ignore[attr-defined]
    users = [f"u{n}" for n in range(30)]
    assert len({s.bucket(u) for u in users}) > 1
    s.append("ml", [Event("taken", "u0", "x", 1.0)])
    call = [Event(f"e{n}", u, "y", 2.0) for n, u in enumerate(users[1:])] + [Event("taken", "u0", "CHANGED", 1.0)]
    assert s.append("ml", call) == ["skipped"] * (len(users) - 1) + ["conflict"]
    assert s.events("ml", users) == {"u0": [("x", 1.0, None)]}
    assert s.append("ml", call[:-1]) == ["stored"] * (len(users) - 1)  # the ids were not taken
    # The arrivals of every bucket, each user's in order, from a cursor of every bucket's position.
    cursor, _ = s.arrivals(None)
    s.append("ml", [Event("a1", "u3", "p", 5.0), Event("a2", "u7", "q", 5.0), Event("a3", "u3", "r", 6.0)])
    cursor, got = s.arrivals(cursor, limit=2)
    cursor, rest = s.arrivals(cursor)
    assert len(got) == 2 and len(rest) == 1
    assert sorted((a.user, a.item) for a in got + rest) == [("u3", "p"), ("u3", "r"), ("u7", "q")]
    assert [a.item for a in got + rest if a.user == "u3"] == ["p", "r"]
    assert s.arrivals(cursor) == (cursor, [])
    with pytest.raises(StoreError, match="cursor"):
        s.arrivals("0-0")
    s.close()


def test_the_setting_opens_a_cluster_store_and_a_braced_prefix_is_refused(
    redis_cluster: object, tmp_path: Path
) -> None:
    url = redis_cluster.url  # type: ignore[attr-defined]
    store = open_store("redis-cluster", sqlite_path=tmp_path / "x", redis_url=url, redis_buckets=3)
    assert isinstance(store, RedisClusterStore) and store.buckets == 3
    store.ping()
    store.close()
    with pytest.raises(StoreError, match="prefix"):
        RedisClusterStore(url, prefix="{x}:")
    with pytest.raises(StoreError, match=r"127\.0\.0\.1:1"):  # the slot map is read when the store is built
        RedisClusterStore("redis://127.0.0.1:1")


def test_an_event_no_replica_acknowledged_in_time_is_refused_and_its_retry_is_a_duplicate(
    redis_cluster: object,
) -> None:
    nodes = redis_cluster
    # Two seconds: a replica on a box busy with the rest of the suite has acknowledged in over 200 ms.
    s = RedisClusterStore(nodes.url, keep=5, buckets=4, wait_replicas=1, wait_timeout_ms=2000)  # type: ignore[attr-defined]
    assert s.append("ml", [Event("e1", "u1", "x", 1.0)]) == ["stored"]  # its replica is there: acknowledged
    replica = nodes.replica_of(nodes.primary_of(s._b(s.bucket("u1"), "x")))  # type: ignore[attr-defined]
    nodes.pause(replica, True)  # type: ignore[attr-defined]
    try:
        with pytest.raises(StoreError, match="0 of 1 replicas"):
            s.append("ml", [Event("e2", "u1", "y", 2.0)])
    finally:
        nodes.pause(replica, False)  # type: ignore[attr-defined]
    # The primary kept it: the client's retry is a duplicate, and the event is there once.
    wait_until(lambda: s.append("ml", [Event("e2", "u1", "y", 2.0)]) == ["duplicate"], timeout=10)
    assert s.events("ml", ["u1"]) == {"u1": [("x", 1.0, None), ("y", 2.0, None)]}
    s.close()


@pytest.mark.slow
def test_a_primary_killed_under_load_loses_no_event_acknowledged_by_a_replica(tmp_path: Path) -> None:
    """Events appended without pause by two writers; the primary of a bucket killed with -9; its replica
    promoted; the killed node started again, now its replica. Every event the store acknowledged (WAIT
    for one replica) is there after, and the writes to the failed-over slots go on."""
    nodes = redis_cluster_nodes(tmp_path / "cluster").start()
    try:
        store = RedisClusterStore(nodes.url, keep=100_000, buckets=8, wait_replicas=1, wait_timeout_ms=500)
        acked: list[Event] = []
        refused = [0]
        done = threading.Event()

        def write(w: int) -> None:
            n = 0
            while not done.is_set():
                n += 1
                e = Event(f"w{w}-{n}", f"u{n % 24}", f"w{w}-{n}", float(n))
                try:
                    if store.append("ml", [e]) in (["stored"], ["duplicate"]):
                        acked.append(e)
                except StoreError:
                    refused[0] += 1  # not acknowledged: a client would send it again

        writers = [threading.Thread(target=write, args=(w,)) for w in range(2)]
        for t in writers:
            t.start()
        try:
            wait_until(lambda: len(acked) >= 200, timeout=30)
            key = store._b(store.bucket("u1"), "x")
            victim = nodes.primary_of(key)
            assert victim is not None
            nodes.kill(victim)
            # Its replica takes over (node timeout 1 s, then an election). Its slots have no replica then, so
            # their events are refused until the killed node is back as the replica of the new primary.
            wait_until(lambda: nodes.healthy() and nodes.primary_of(key) not in (None, victim), timeout=30)
            on_it = [u for u in (f"u{n}" for n in range(24)) if store.bucket(u) == store.bucket("u1")]
            nodes.restart(victim)
            before = sum(e.user_id in on_it for e in acked)
            wait_until(lambda: sum(e.user_id in on_it for e in acked) >= before + 50, timeout=30)
        finally:
            done.set()
            for t in writers:
                t.join(timeout=30)
        users = [f"u{n}" for n in range(24)]
        held = {item for timeline in store.events("ml", users).values() for item, _, _ in timeline}
        lost = [e.item_id for e in acked if e.item_id not in held]
        assert lost == [], f"{len(lost)} of {len(acked)} acknowledged events lost ({refused[0]} refused)"
        assert refused[0] > 0  # the calls during the failover were refused, not acknowledged
        store.close()
    finally:
        nodes.stop()
