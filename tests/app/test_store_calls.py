"""Store calls on the request path: reads never wait behind writes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.servers import RedisServer, wait_until

Y2005 = 1_104_537_600.0


def test_writes_waiting_for_a_replica_never_hold_up_reads(tiny_artifacts: Path, redis_server: RedisServer) -> None:
    """SEQSERVE_REDIS_WAIT_REPLICAS=1 on a primary with no replica: each write waits the whole
    SEQSERVE_REDIS_WAIT_MS and is refused (503). A dozen of them in flight must not stall other users'
    reads: every read is answered before the first of those writes ends."""
    settings = Settings(
        artifacts_dir=tiny_artifacts,
        device="cpu",
        history_store="redis",
        redis_url=redis_server.url,
        redis_wait_replicas=1,
        redis_wait_ms=4_000,
    )
    probe = redis.Redis.from_url(redis_server.url)
    ended: list[int] = []

    def waiting() -> bool:  # writes holding their thread in a WAIT
        return sum(c.get("cmd") == "wait" for c in probe.client_list()) >= 6

    with TestClient(create_app(settings)) as c:

        def write(n: int) -> None:
            ev = {"event_id": f"w{n}", "user_id": f"writer{n}", "item_id": "12", "timestamp": Y2005}
            ended.append(c.post("/events", json={"events": [ev]}).status_code)

        with ThreadPoolExecutor(12) as pool:
            for n in range(12):
                pool.submit(write, n)
            wait_until(waiting)
            for user in ("u1", "u2", "u3", "u4"):
                r = c.post("/recommend", json={"queries": [{"user_id": user, "k": 3}]})
                assert r.status_code == 200, r.text
            assert c.get("/history", params={"user_id": "u1"}).status_code == 200
            assert c.get("/readyz").status_code == 200
            assert ended == []  # every read above was answered while all the writes still waited
        assert ended == [503] * 12  # and each write, never acknowledged by a replica, was refused
    probe.close()


def test_heavy_users_are_read_whole_but_the_loop_reads_a_bounded_share(tiny_artifacts: Path, tmp_path: Path) -> None:
    """A by-user read of a few users on SQLite runs on the event loop, at most LOOP_READ_ROWS rows of it:
    users holding more than their share are read again, whole, in a store thread. Every user gets all
    their live events either way."""
    import asyncio
    import threading

    from app.answering import LOOP_READ_ROWS, live_history
    from app.store import Event, SQLiteStore
    from models.tasks.recommend import RecQuery

    store = SQLiteStore(tmp_path / "h.sqlite3", keep=1000)
    app = create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu", history_path=tmp_path / "own.sqlite3"))
    with TestClient(app):
        engine = app.state.services.loaded.models["sasrec-tiny"].engine
        heavy = [f"heavy{n}" for n in range(7)]
        for user in heavy:
            store.append(engine.namespace, [Event(f"{user}-{i}", user, "12", Y2005 + i) for i in range(1000)])
        store.append(engine.namespace, [Event("light-0", "light", "13", Y2005)])
        reads: list[tuple[bool, int, int]] = []  # (on the loop's thread, users, limit)
        plain = store.events

        def events(namespace: str, users: list[str], limit: int | None = None) -> dict[str, object]:
            reads.append((threading.current_thread() is loop_thread, len(set(users)), limit or 0))
            return plain(namespace, users, limit)  # type: ignore[return-value]

        store.events = events  # type: ignore[method-assign]
        loop_thread = threading.current_thread()  # asyncio.run below runs its loop on this thread
        got = asyncio.run(live_history(engine, [RecQuery(user_id=u) for u in [*heavy, "light"]], store))
    assert {u: len(t) for u, t in got.items()} == {**{u: 1000 for u in heavy}, "light": 1}
    assert got["heavy0"] == plain(engine.namespace, ["heavy0"], 1000)["heavy0"]
    on_loop = [users * limit for here, users, limit in reads if here]
    assert on_loop and sum(on_loop) <= LOOP_READ_ROWS
    assert [(users, limit) for here, users, limit in reads if not here] == [(7, 1000)]  # the heavy ones, whole
    store.close()
