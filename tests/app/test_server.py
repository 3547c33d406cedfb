"""The real server on loopback: a bounded soak with mixed traffic, then a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from app.server import HEALTH_RESERVE
from tests.servers import ROOT, start_api, stop, wait_until

SOAK_SECONDS = float(os.environ.get("SEQSERVE_SOAK_SECONDS", "8"))


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def server(tiny_artifacts: Path):  # type: ignore[no-untyped-def]
    proc, url = start_api(tiny_artifacts)
    yield proc, url
    stop(proc)


VALID = [{"queries": [{"user_id": f"u{i}", "k": 5}]} for i in range(40)] + [
    {"model": "bert4rec-tiny", "queries": [{"history": [{"item_id": "12"}, {"item_id": "13"}]}] * 3}
]
INVALID = [
    {"queries": []},
    {"queries": [{"k": 0}]},
    {"queries": [{"user_id": "ghost", "on_unknown": "error"}]},
    [1],
    {"model": "x"},
]


@pytest.mark.slow
def test_soak_then_clean_stop(server) -> None:  # type: ignore[no-untyped-def]
    proc, url = server

    async def soak() -> tuple[int, int, list[str]]:
        ok = bad = 0
        failures: list[str] = []
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            end = time.monotonic() + SOAK_SECONDS

            async def worker(seed: int) -> None:
                nonlocal ok, bad
                rng = random.Random(seed)
                while time.monotonic() < end:
                    valid = rng.random() < 0.7
                    r = await c.post("/recommend", json=rng.choice(VALID if valid else INVALID))
                    if valid and r.status_code != 200:
                        failures.append(f"{r.status_code} {r.text[:200]}")
                    elif not valid and not 400 <= r.status_code < 500:
                        failures.append(f"invalid body answered {r.status_code}")
                    ok += valid
                    bad += not valid

            await asyncio.gather(*[worker(i) for i in range(32)])
        return ok, bad, failures

    rss_before = _rss_mb(proc.pid)
    ok, bad, failures = asyncio.run(soak())
    rss_after = _rss_mb(proc.pid)
    assert failures == [] and ok > 100 and bad > 30
    assert rss_after - rss_before < 100, f"resident memory grew {rss_before:.0f} -> {rss_after:.0f} MB"

    # Graceful stop after the soak (requests in flight at the signal: the next test).
    proc.send_signal(signal.SIGTERM)
    # uvicorn re-raises the signal after its graceful shutdown: killed-by-SIGTERM, not a crash.
    assert proc.wait(timeout=30) in (0, -signal.SIGTERM)


def _gauge(metrics: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name))


def test_requests_in_flight_at_sigterm_are_answered(tiny_artifacts: Path) -> None:
    """Requests the server has accepted when SIGTERM arrives are all answered before it exits.

    Each request has its own connection: an idle keep-alive connection closed at shutdown can race
    a client's next request, which HTTP clients retry; that is not an accepted request.
    """
    import threading

    proc, url = start_api(tiny_artifacts, {"SEQSERVE_MAX_QUERIES": "2048", "SEQSERVE_MAX_TOTAL_K": "50000"})
    heavy = {"queries": [{"user_id": f"u{i % 40}", "k": 20} for i in range(2048)]}
    results: list[int | str] = []
    started = threading.Barrier(17)

    def client() -> None:
        with httpx.Client(timeout=60) as c:
            started.wait()
            try:
                results.append(c.post(f"{url}/recommend", json=heavy).status_code)
            except httpx.HTTPError as exc:
                results.append(repr(exc))

    threads = [threading.Thread(target=client) for _ in range(16)]
    for t in threads:
        t.start()
    started.wait()
    # Wait until the server has started all 16 (besides this /metrics request), then stop it. A
    # connection whose request the server has not read yet is not accepted: uvicorn closes it.
    wait_until(
        lambda: _gauge(httpx.get(f"{url}/metrics", timeout=5).text, "seqserve_requests_in_progress") >= 17,
        timeout=20,
        every=0.01,
    )
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=60)
    assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    assert results == [200] * 16, results


# --- what a client can do to a connection ------------------------------------------------------------

LIMITS = {
    "SEQSERVE_MAX_HEADER_BYTES": "4096",
    "SEQSERVE_REQUEST_READ_TIMEOUT_S": "1.5",
    "SEQSERVE_MAX_CONNECTIONS": "6",
    "SEQSERVE_LOG_LEVEL": "INFO",
}


@pytest.fixture(scope="module")
def guarded(tiny_artifacts: Path):  # type: ignore[no-untyped-def]
    proc, url = start_api(tiny_artifacts, LIMITS)
    yield proc, url
    stop(proc)


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """(status, whole answer) read until the server closes."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return (int(data.split(b" ", 2)[1]) if data else 0), data


def orjson_padded(body: dict, size: int) -> bytes:
    """`body` as JSON, padded with whitespace to `size` bytes."""
    import json

    raw = json.dumps(body).encode()
    return raw + b" " * (size - len(raw))


def test_a_header_over_the_limit_is_431_and_closed(guarded) -> None:  # type: ignore[no-untyped-def]
    _, url = guarded
    with _connect(url) as s:  # a complete 64 KB header
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n")
        status, data = _answer(s)
    assert status == 431 and b'"code":"headers_too_large"' in data
    with _connect(url) as s:  # a header that never ends is refused once it passes the limit
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8192)
        status, _ = _answer(s)
    assert status == 431  # the size ended it: the read deadline would have answered 408
    assert httpx.get(f"{url}/healthz", headers={"X-Ok": "a" * 2000}).status_code == 200
    big_body = {"queries": [{"user_id": f"u{i % 40}", "k": 1} for i in range(8)], "model": "sasrec-tiny"}
    r = httpx.post(
        f"{url}/recommend", content=orjson_padded(big_body, 60_000), headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text  # a large body is no header


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # connected, nothing sent
        b"POST /recommend HTTP/1.1\r\nHost: x\r\n",  # headers never finished
        b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        b"POST /recommend HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",  # chunked, unfinished
    ],
)
def test_a_request_not_received_in_time_is_408_and_closed(guarded, sent: bytes) -> None:  # type: ignore[no-untyped-def]
    _, url = guarded
    with _connect(url) as s:  # a server that never closed it would leave recv to the socket's 10 s timeout
        s.sendall(sent)
        status, data = _answer(s)
    assert status == 408 or (status == 0 and sent), (status, data[:200])


def _connect_from(url: str, source: str) -> socket.socket:
    """A connection from another loopback address: another client as far as the server can tell."""
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))


def _request(sock: socket.socket, raw: bytes) -> tuple[int, bytes]:
    sock.sendall(raw)
    return _answer(sock)


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
HEALTH = HEALTHZ.replace(b"Connection: close", b"Connection: keep-alive")  # a reserve answer closes it anyway
RECOMMEND = (
    b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b'Content-Length: 40\r\n\r\n{"queries":[{"user_id":"u1","k":1}]}    '
)


def test_past_the_cap_only_health_checks_get_in(guarded) -> None:  # type: ignore[no-untyped-def]
    _, url = guarded
    held = [_connect(url) for _ in range(6)]  # the cap (6), all idle
    try:
        wait_until(lambda: _open_connections(url) >= 6)
        with _connect(url) as s:  # past the cap: a request for the API is refused
            status, data = _request(s, RECOMMEND)
        assert status == 503 and b"retry-after: 1" in data.lower()
        for path in (b"/healthz", b"/readyz"):  # and a health check answered from the reserve
            with _connect(url) as s:
                status, _ = _request(s, HEALTHZ.replace(b"/healthz", path))
            assert status == 200, path
        parked = [_connect(url) for _ in range(HEALTH_RESERVE + 8)]  # more idle ones than the reserve holds
        try:
            wait_until(lambda: _open_connections(url) >= 6 + HEALTH_RESERVE)
            with _connect(url) as s:  # a probe still gets in: the oldest parked connection made room
                assert _request(s, HEALTH)[0] == 200
            assert _answer(parked[0])[0] == 0  # closed without an answer: it never asked anything
        finally:
            for s in parked:
                s.close()
    finally:
        for s in held:
            s.close()
    wait_until(lambda: httpx.get(f"{url}/healthz").status_code == 200)  # room again once they are gone


def test_one_address_cannot_take_every_connection(tiny_artifacts: Path) -> None:
    limits = {**LIMITS, "SEQSERVE_MAX_CONNECTIONS": "20", "SEQSERVE_MAX_CONNECTIONS_PER_CLIENT": "5"}
    proc, url = start_api(tiny_artifacts, limits)
    try:
        hog = [_connect_from(url, "127.0.0.2") for _ in range(5)]
        wait_until(lambda: _open_connections(url) >= 5)
        with _connect_from(url, "127.0.0.2") as s:  # its sixth: for a health check only
            status, data = _request(s, RECOMMEND)
        assert status == 503 and b"from this address" in data
        assert _status_from(url, "127.0.0.2", HEALTHZ) == 200  # a probe beside the hog (a proxy, a NAT) gets in
        with _connect_from(url, "127.0.0.1") as s:  # anyone else is served
            assert _request(s, RECOMMEND)[0] == 200
        for s in hog:
            s.close()
        wait_until(lambda: _status_from(url, "127.0.0.2", RECOMMEND) == 200)  # its share back once closed
    finally:
        stop(proc)


def test_the_reserve_answers_probes_whatever_five_addresses_park_there(tiny_artifacts: Path) -> None:
    import threading

    limits = {**LIMITS, "SEQSERVE_MAX_CONNECTIONS": "20", "SEQSERVE_MAX_CONNECTIONS_PER_CLIENT": "8"}
    proc, url = start_api(tiny_artifacts, limits)
    done = threading.Event()
    deadline = time.monotonic() + 20  # bounded whatever happens to the test

    def park(source: str) -> None:  # half-open connections, reconnecting as the server closes them
        held: list[socket.socket] = []
        # Paced: five threads at a connection every 5 ms each (1,000 a second) still replace the reserve's parked
        # connections faster than they time out; unpaced, the flood cost the box more than the server.
        while not done.wait(0.005) and time.monotonic() < deadline:
            try:
                held.append(_connect_from(url, source))
            except OSError:
                continue
            if len(held) > 120:
                held.pop(0).close()
        for s in held:
            s.close()

    attackers = [threading.Thread(target=park, args=(f"127.0.0.{n}",)) for n in range(2, 7)]
    try:
        for t in attackers:
            t.start()
        wait_until(lambda: _open_connections(url) >= 20 + HEALTH_RESERVE)
        for source in ("127.0.0.1", "127.0.0.2"):  # a probe from elsewhere, and from a parking address
            for _ in range(10):
                # As a kubelet probes (failureThreshold 3): a flood that outpaces the event loop can close
                # a reserve connection before its request is read; without the reserve none would pass.
                assert 200 in (_status_from(url, source, HEALTHZ) for _ in range(3)), source
    finally:
        done.set()
        for t in attackers:
            t.join()
        stop(proc)


def _status_from(url: str, source: str, raw: bytes) -> int:
    with _connect_from(url, source) as s:
        return _request(s, raw)[0]


def _open_connections(url: str) -> int:
    """Established TCP connections on the server's side of its port (from /proc/net/tcp)."""
    port = int(url.rsplit(":", 1)[1])
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for r in rows if r.split()[1].endswith(f":{port:04X}") and r.split()[3] == "01")


def test_a_client_that_hangs_up_mid_body_is_not_a_server_error(guarded) -> None:  # type: ignore[no-untyped-def]
    _, url = guarded

    def counts() -> dict[str, float]:
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in httpx.get(f"{url}/metrics").text.splitlines()
            if line.startswith(("seqserve_requests_total{", "seqserve_rejected_total{"))
        }

    before = counts()
    for path in ("/recommend", "/next-location", "/events"):
        with _connect(url) as s:
            s.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: 100\r\n\r\n{".encode()
            )
    key = 'seqserve_rejected_total{reason="client_disconnected"}'
    wait_until(lambda: counts().get(key, 0) - before.get(key, 0) >= 3)
    after = counts()
    grew = {
        k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0) and 'endpoint="/metrics"' not in k
    }
    assert not any('status="5' in k or "internal_error" in k for k in after)
    assert grew == {
        'seqserve_rejected_total{reason="client_disconnected"}': 3,
        **{
            f'seqserve_requests_total{{endpoint="{p}",model="-",status="499"}}': 1
            for p in ("/recommend", "/next-location", "/events")
        },
    }


def test_the_connection_closed_flag_sees_a_client_leave_after_a_large_body() -> None:
    """The flag the batcher asks (app/server.py's scope extension) turns true when a client that sent
    a large body hangs up while its request waits, although the app reads nothing more from it."""
    import asyncio
    import threading
    from functools import partial

    import uvicorn

    from app.middleware import CONNECTION_CLOSED
    from app.server import ConnectionLimits, GuardedHttpTools
    from tests.servers import free_port

    seen: list[bool] = []
    read = threading.Event()

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        await asyncio.sleep(0.2)  # a busy loop: the body waits in the socket and comes in full chunks
        more = True
        while more:  # the whole body, as the service's parse_body reads it
            more = (await receive()).get("more_body", False)
        read.set()
        closed = scope["extensions"][CONNECTION_CLOSED]
        for _ in range(300):  # "waiting for the model": the app never calls receive() again
            if closed():
                break
            await asyncio.sleep(0.01)
        seen.append(closed())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        http=partial(GuardedHttpTools, limits=ConnectionLimits()),
    )  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started)
        body = b"x" * 3_000_000  # read in chunks far over uvicorn's 64 KB read-pause mark
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            assert read.wait(10)  # the app has the whole body and waits: now the client leaves
        wait_until(lambda: bool(seen))
        assert seen == [True]
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _large_head(size: int) -> bytes:
    return b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % size


def _one_answer(sock: socket.socket) -> tuple[int, bytes]:
    """(status, head and body) of one answer on a connection that stays open."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        declared = head.lower().split(b"content-length:")
        if sep and len(declared) > 1 and len(body) >= int(declared[1].split(b"\r\n")[0]):
            break
    return (int(data.split(b" ", 2)[1]) if data else 0), data


def _refused_at_once(url: str, head: bytes) -> bool:
    """Whether a large body's request is refused (503, Retry-After) before its body is sent."""
    with _connect(url) as s:
        s.settimeout(0.5)
        s.sendall(head)
        try:
            status, data = _one_answer(s)
        except TimeoutError:
            return False  # taken: it waits for the body
    return status == 503 and b"retry-after: 1" in data.lower()


def test_unfinished_bodies_have_a_total(tiny_artifacts: Path) -> None:
    """Two 1 MB bodies fill a 2 MB budget: a third large one is refused before it is read, a small
    request is still served, and the room comes back when the holders leave."""
    mb = 1 << 20
    limits = {"SEQSERVE_MAX_BODY_BYTES": str(mb), "SEQSERVE_MAX_BODY_BYTES_IN_FLIGHT": str(2 * mb)}
    proc, url = start_api(tiny_artifacts, {**LIMITS, "SEQSERVE_REQUEST_READ_TIMEOUT_S": "30", **limits})
    try:
        holders = [_connect(url) for _ in range(2)]
        for s in holders:
            s.sendall(_large_head(mb) + b" " * (mb - 1))  # all but the last byte
        wait_until(lambda: _refused_at_once(url, _large_head(mb)))
        chunked = b"POST /recommend HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        with _connect(url) as s:  # a streamed body is counted as it grows
            s.sendall(chunked + b"20000\r\n" + b" " * 0x20000 + b"\r\n")
            status, _ = _one_answer(s)
        assert status == 503
        assert httpx.post(f"{url}/recommend", json={"queries": [{"user_id": "u1", "k": 1}]}).status_code == 200
        for s in holders:
            s.close()
        body = orjson_padded({"model": "sasrec-tiny", "queries": [{"user_id": "u1", "k": 1}]}, mb)
        post = lambda: httpx.post(f"{url}/recommend", content=body, headers={"content-type": "application/json"})  # noqa: E731
        wait_until(lambda: post().status_code == 200)
    finally:
        stop(proc)


def test_the_parent_of_several_workers_and_the_stores_load_no_torch() -> None:
    """The parent only supervises its workers, and a store only keeps events: neither needs torch
    (about 2 s and 300 MB a process here), so a multi-worker start pays it once per worker only."""
    import subprocess
    import sys

    loaded = "sorted(m for m in sys.modules if m.split('.')[0] == 'torch')"
    probe = f"import sys, app.server, app.store, app.settings; print({loaded})"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
