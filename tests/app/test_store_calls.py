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
