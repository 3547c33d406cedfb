"""Metrics, request ids and request limits through the real app."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import httpx2 as httpx
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.servers import wait_until, wait_until_async

ROOT = Path(__file__).resolve().parents[2]


def test_request_id_is_echoed_or_generated(tiny_artifacts: Path) -> None:
    with TestClient(create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu"))) as c:
        r = c.post("/recommend", json={"queries": [{"user_id": "u1"}]}, headers={"X-Request-ID": "abc-123"})
        assert r.headers["X-Request-ID"] == "abc-123"
        # A value that could forge a log line (quotes, controls) or is too long is replaced, not logged.
        for forged in (b'a"b', b"x" * 129, b"a b", "é".encode(), b"a\\nb"):
            got = c.get("/healthz", headers={"X-Request-ID": forged}).headers["X-Request-ID"]
            assert got.encode() != forged and len(got) == 32
        r = c.post("/recommend", json={"queries": []})
        assert r.status_code == 422 and len(r.headers["X-Request-ID"]) == 32
        assert c.get("/healthz").headers["X-Request-ID"] != r.headers["X-Request-ID"]


def test_body_limit_is_413_json(tiny_artifacts: Path) -> None:
    with TestClient(create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu", max_body_bytes=2048))) as c:
        big = {"queries": [{"history": [{"item_id": "12"}] * 200}]}
        r = c.post("/recommend", json=big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

        def chunks():  # type: ignore[no-untyped-def]
            yield b'{"queries": ['
            for _ in range(200):  # about 3.6 kB, no Content-Length
                yield b'{"user_id": "u1"},'
            yield b'{"user_id": "u1"}]}'

        r = c.post("/recommend", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413


def test_history_truncation_is_reported(tiny_artifacts: Path) -> None:
    with TestClient(create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu"))) as c:
        long = [{"item_id": str(10 + i % 30)} for i in range(40)]  # the tiny models read 16
        body = {"model": "sasrec-tiny", "queries": [{"history": long}, {"history": long[:3]}]}
        res = c.post("/recommend", json=body).json()["results"]
        assert [r["history_truncated"] for r in res] == [True, False]


def test_metrics_show_batches_above_one_under_concurrency(tiny_artifacts: Path) -> None:
    app = create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu", max_wait_ms=20))

    async def go() -> str:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                bodies = [{"model": "sasrec-tiny", "queries": [{"user_id": f"u{i}"}]} for i in range(30)]
                rs = await asyncio.gather(*[c.post("/recommend", json=b) for b in bodies])
                assert all(r.status_code == 200 for r in rs)
                await c.post("/recommend", json={"queries": []})
                unknown = await c.post(
                    "/recommend",
                    json={"model": "sasrec-tiny", "queries": [{"user_id": "nobody", "on_unknown": "error"}]},
                )
                assert unknown.status_code == 404
                return (await c.get("/metrics")).text

    text = asyncio.run(go())
    assert 'seqserve_requests_total{endpoint="/recommend",model="sasrec-tiny",status="200"} 30.0' in text
    assert 'seqserve_requests_total{endpoint="/recommend",model="sasrec-tiny",status="404"} 1.0' in text
    assert 'seqserve_requests_total{endpoint="/recommend",model="-",status="422"} 1.0' in text
    assert 'seqserve_rejected_total{reason="invalid_request"} 1.0' in text
    count = float(
        next(
            ln.split()[-1]
            for ln in text.splitlines()
            if ln.startswith('seqserve_batch_size_count{model="sasrec-tiny"}')
        )
    )
    total = float(
        next(
            ln.split()[-1] for ln in text.splitlines() if ln.startswith('seqserve_batch_size_sum{model="sasrec-tiny"}')
        )
    )
    assert total == 30 and count < 30  # some model calls carried more than one request
    assert 'seqserve_queue_depth{model="sasrec-tiny"} 0.0' in text
    assert "seqserve_requests_in_progress 1.0" in text  # the /metrics request itself; the 32 others ended


@pytest.mark.slow
def test_metrics_of_several_workers_are_summed(tmp_path: Path) -> None:
    """SEQSERVE_WORKERS > 1: each process counts into the shared folder; /metrics renders the sum."""
    import subprocess
    import sys

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    count = (
        "from app.observability import Metrics; m = Metrics(); "
        "[m.requests.labels('/recommend', 'm', '200').inc() for _ in range({n})]"
    )
    for n in (3, 4):  # two worker processes, one after the other
        subprocess.run([sys.executable, "-c", count.format(n=n)], env=env, check=True, cwd=ROOT)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from app.observability import Metrics; import sys; sys.stdout.write(Metrics().render().decode())",
        ],
        env=env,
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("seqserve_requests_total{"))
    assert float(line.split()[-1]) == 7.0


def _blocked_model(app: object, name: str) -> tuple[threading.Event, threading.Event, list[int]]:
    """Make `name`'s model calls wait on a gate: (gate, entered, sizes of the batches it ran)."""
    served = app.state.services.loaded.models[name]  # type: ignore[attr-defined]
    gate, entered, sizes = threading.Event(), threading.Event(), []
    real = served.batcher.fn

    def blocked(items: list) -> list:  # type: ignore[type-arg]
        entered.set()
        gate.wait(20)
        sizes.append(len(items))
        return real(items)  # type: ignore[no-any-return]

    served.batcher.fn = blocked
    return gate, entered, sizes


def test_each_worker_sets_its_own_queue_depth_gauge(tiny_artifacts: Path) -> None:
    """Without a scrape: the gauge follows the queue (with several workers, each one's counts in the sum)."""
    app = create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu", housekeeping_s=0.05, max_batch_size=1))
    with TestClient(app) as c:
        gate, entered, _ = _blocked_model(app, "sasrec-tiny")
        body = {"model": "sasrec-tiny", "queries": [{"user_id": "u1"}]}
        threads = [threading.Thread(target=c.post, args=("/recommend",), kwargs={"json": body}) for _ in range(4)]
        for t in threads:
            t.start()
        registry = app.state.services.metrics.registry
        deadline = time.monotonic() + 10
        while registry.get_sample_value("seqserve_queue_depth", {"model": "sasrec-tiny"}) != 3.0:
            assert time.monotonic() < deadline, "the gauge never showed the 3 waiting requests"
            time.sleep(0.02)
        gate.set()
        for t in threads:
            t.join()
        assert entered.is_set()


@pytest.mark.slow
def test_a_dead_worker_s_gauges_leave_the_sum(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run(
        [sys.executable, "-c", "from app.observability import Metrics; Metrics().queue_depth.labels('m').set(5)"],
        env=env,
        check=True,
        cwd=ROOT,
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from app.observability import Metrics; import sys; m = Metrics(); "
            "m.queue_depth.labels('m').set(2); sys.stdout.write(m.render().decode())",
        ],
        env=env,
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    assert 'seqserve_queue_depth{model="m"} 2.0' in out  # the live worker's 2, not 7


def test_access_lines_are_written_in_batches_in_the_log_format(tmp_path: Path) -> None:
    import json as _json

    from app.observability import AccessLog

    out = tmp_path / "access.log"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT)

    async def run() -> tuple[str, str]:
        log = AccessLog(json_lines=True, flush_s=0.05, fd=fd)
        log.write("POST /recommend 200 1.2ms", "rid-1")
        log.write("GET /models 200 0.3ms", "rid-2")
        before = out.read_text()  # kept, not yet written
        await wait_until_async(lambda: "rid-2" in out.read_text())  # the timer's flush
        plain = AccessLog(json_lines=False, fd=fd)
        plain.write("GET /history 401 0.1ms", "rid-3")
        plain.flush()
        return before, out.read_text()

    try:
        before, text = asyncio.run(run())
    finally:
        os.close(fd)
    assert before == ""
    first, second, third = text.splitlines()
    assert _json.loads(first) | {"time": "-"} == {
        "time": "-",
        "level": "INFO",
        "logger": "app.access",
        "message": "POST /recommend 200 1.2ms",
        "request_id": "rid-1",
    }
    assert _json.loads(second)["request_id"] == "rid-2"
    assert third.endswith(" INFO app.access: GET /history 401 0.1ms")


def test_metrics_say_when_each_serving_version_was_published(tiny_artifacts: Path, tmp_path: Path) -> None:
    """The gauge ops/prometheus/alerts.yml's SeqserveModelStale reads, set by every housekeeping tick from the
    version's manifest (its folder's name can be a copy's or a rename's)."""
    from fastapi.testclient import TestClient

    from models.artifact import latest_versions, read_manifest

    settings = Settings(artifacts_dir=tiny_artifacts, device="cpu", history_path=tmp_path / "h.sqlite3")
    with TestClient(create_app(settings.model_copy(update={"housekeeping_s": 0.05}))) as c:
        want = read_manifest(latest_versions(tiny_artifacts)["sasrec-tiny"]).created

        def shown() -> float | None:
            for line in c.get("/metrics").text.splitlines():
                if line.startswith('seqserve_model_published_seconds{model="sasrec-tiny"}'):
                    return float(line.split()[-1])
            return None

        wait_until(lambda: shown() is not None)
        assert shown() == want
        assert want is not None and want > 1.7e9  # a real time: the manifest's created_at parsed


def test_the_access_log_names_the_client_by_address_only(tmp_path: Path) -> None:
    """The client comes from X-Forwarded-For where the peer is trusted: only an address is written, never
    the header's other text (a trusted peer may still pass on what a client sent)."""
    import logging

    from app.middleware import Observe
    from app.observability import AccessLog, Metrics

    out = tmp_path / "access.log"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT)
    level = logging.getLogger("app.access").level
    logging.getLogger("app.access").setLevel(logging.INFO)
    log = AccessLog(json_lines=False, fd=fd)

    async def ok(scope: object, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    async def sent(message: object) -> None:
        pass

    async def run() -> None:
        observe = Observe(ok, Metrics(), log)  # type: ignore[arg-type]
        for client in (("10.0.0.7", 1), ("::1", 2), ("a" * 9000, 3), ("x y", 4)):
            scope = {"type": "http", "method": "GET", "path": "/x", "headers": [], "client": client}
            await observe(scope, None, sent)  # type: ignore[arg-type]
        log.flush()

    try:
        asyncio.run(run())
    finally:
        os.close(fd)
        logging.getLogger("app.access").setLevel(level)
    clients = [line.split("app.access: ")[1].split()[0] for line in out.read_text().splitlines()]
    assert clients == ["10.0.0.7", "::1", "-", "-"]
