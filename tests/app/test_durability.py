"""Acknowledged events survive kill -9 (SQLite and Redis), and instances sharing Redis see each other's."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from app.store import Event, HistoryStore, RedisStore, SQLiteStore
from models.artifact import latest_versions
from models.tasks.recommend import load_artifact as load_rec_artifact
from tests.conftest import stored
from tests.servers import RedisServer, start_api, stop

NS = "sasrec-tiny"  # the tiny models name no data set: the namespace is the model name


def _post_until_killed(url: str, proc_pid: int, after_s: float) -> list[Event]:
    """Post events one request at a time; SIGKILL the server `after_s` into the stream.

    Returns the events of every request that was answered 200 before the kill.
    """
    acked: list[Event] = []
    stop_at = time.monotonic() + after_s
    killed = threading.Event()

    def killer() -> None:
        time.sleep(max(0.0, stop_at - time.monotonic()))
        os.kill(proc_pid, signal.SIGKILL)
        killed.set()

    threading.Thread(target=killer, daemon=True).start()
    n = 0
    with httpx.Client(base_url=url, timeout=5) as c:
        while not killed.is_set() or n == 0:
            ids = [f"k{n}-{j}" for j in range(5)]
            events = [
                {"event_id": e, "user_id": f"u{n % 40}", "item_id": str(10 + (n + j) % 30), "timestamp": 1.2e9 + n}
                for j, e in enumerate(ids)
            ]
            try:
                r = c.post("/events", json={"model": NS, "events": events})
            except httpx.HTTPError:
                break  # the kill landed mid-request: not acknowledged, so not promised
            if r.status_code == 200:
                acked += [Event(e["event_id"], e["user_id"], e["item_id"], e["timestamp"]) for e in events]
            n += 1
    return acked


def _all_stored(store: HistoryStore, acked: list[Event]) -> bool:
    """Whether the store holds every acknowledged event: posted again, each is a duplicate."""
    return store.append(NS, acked) == ["duplicate"] * len(acked)


def _check_served_after_restart(artifacts: Path, env: dict[str, str], user: str, acked: list[Event]) -> None:
    proc, url = start_api(artifacts, env)
    try:
        first = {"event_id": acked[0].event_id, "user_id": user, "item_id": "10", "timestamp": 1.2e9}  # as first posted
        r = httpx.post(f"{url}/events", json={"model": NS, "events": [first]}, timeout=10)
        assert r.status_code == 200 and r.json()["duplicates"] == 1  # the id survived the kill
        r = httpx.post(f"{url}/events", json={"model": NS, "events": [{**first, "item_id": "11"}]}, timeout=10)
        assert r.status_code == 409  # and so did its payload
        rec = httpx.post(f"{url}/recommend", json={"model": NS, "queries": [{"user_id": user, "k": 30}]}, timeout=10)
        assert rec.status_code == 200
    finally:
        stop(proc)


def _serve_and_kill(artifacts: Path, env: dict[str, str]) -> list[Event]:
    """Start the service, post events until SIGKILL lands 1.5 s in; the acknowledged event ids."""
    proc, url = start_api(artifacts, env)
    try:
        acked = _post_until_killed(url, proc.pid, after_s=1.5)
    finally:
        stop(proc)
    assert proc.returncode == -signal.SIGKILL and len(acked) >= 5
    return acked


def test_sqlite_events_survive_kill_9(tiny_artifacts: Path, tmp_path: Path) -> None:
    db = tmp_path / "kill.sqlite3"
    env = {"SEQSERVE_HISTORY_PATH": str(db)}
    acked = _serve_and_kill(tiny_artifacts, env)
    store = SQLiteStore(db)
    try:
        assert _all_stored(store, acked)
    finally:
        store.close()
    _check_served_after_restart(tiny_artifacts, env, "u0", acked)


@pytest.mark.slow
def test_redis_events_survive_kill_9_of_api_and_redis(
    tiny_artifacts: Path, tmp_path: Path, redis_server: RedisServer
) -> None:
    env = {"SEQSERVE_HISTORY_STORE": "redis", "SEQSERVE_REDIS_URL": redis_server.url}
    acked = _serve_and_kill(tiny_artifacts, env)
    # Redis dies too, without a chance to save: the append-only file must hold every acknowledged event.
    redis_server.kill()
    redis_server.start()
    store = RedisStore(redis_server.url)
    try:
        assert _all_stored(store, acked)
    finally:
        store.close()
    _check_served_after_restart(tiny_artifacts, env, "u0", acked)


def test_two_instances_share_one_redis(tiny_artifacts: Path, redis_server: RedisServer) -> None:
    env = {"SEQSERVE_HISTORY_STORE": "redis", "SEQSERVE_REDIS_URL": redis_server.url}
    a, url_a = start_api(tiny_artifacts, env)
    b, url_b = start_api(tiny_artifacts, env)
    try:
        with httpx.Client(timeout=10) as c:
            query = {"model": NS, "queries": [{"user_id": "u9", "k": 3}]}
            before = c.post(f"{url_b}/recommend", json=query).json()["results"][0]
            top = before["items"][0]["item_id"]
            r = c.post(
                f"{url_a}/events",
                json={
                    "model": NS,
                    "events": [{"event_id": "shared-1", "user_id": "u9", "item_id": top, "timestamp": 1.5e9}],
                },
            )
            assert r.status_code == 200 and r.json()["stored"] == 1
            after = c.post(f"{url_b}/recommend", json=query).json()["results"][0]
            assert top not in {i["item_id"] for i in after["items"]}
            assert after["excluded"]["seen"] == before["excluded"]["seen"] + 1
            # The replay is a no-op whichever instance it reaches.
            r = c.post(
                f"{url_b}/events",
                json={
                    "model": NS,
                    "events": [{"event_id": "shared-1", "user_id": "u9", "item_id": top, "timestamp": 1.5e9}],
                },
            )
            assert r.json()["duplicates"] == 1
    finally:
        stop(a)
        stop(b)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_restart_does_not_fold_again_or_lose_events(
    tiny_artifacts: Path, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    env = {"SEQSERVE_HISTORY_PATH": str(tmp_path / "r.sqlite3")}
    if kind == "redis":
        env |= {"SEQSERVE_HISTORY_STORE": "redis", "SEQSERVE_REDIS_URL": request.getfixturevalue("redis_server").url}
    first, *_ = stored(load_rec_artifact(latest_versions(tiny_artifacts)[NS]), "u2")
    held = (first[0], first[1])

    def open_test_store() -> HistoryStore:
        return SQLiteStore(tmp_path / "r.sqlite3") if kind == "sqlite" else RedisStore(env["SEQSERVE_REDIS_URL"])

    for attempt in range(2):
        proc, url = start_api(tiny_artifacts, env)
        try:
            r = httpx.post(
                f"{url}/events",
                json={
                    "model": NS,
                    "events": [{"event_id": "r1", "user_id": "u1", "item_id": "11", "timestamp": 1.5e9}],
                },
                timeout=10,
            )
            assert r.json()["stored" if attempt == 0 else "duplicates"] == 1
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        if attempt == 0:
            # Behind the service's back, a live event the artifact holds: dropping trained events again would drop it.
            store = open_test_store()
            store.append(NS, [Event("marker", "u2", held[0], held[1])])
            store.close()
    store = open_test_store()
    try:
        assert store.events(NS, ["u1"])["u1"] == [("11", 1.5e9, None)]
        assert store.events(NS, ["u2"])["u2"] == [(held[0], held[1], None)]  # not folded a second time
    finally:
        store.close()
