"""The shipped balancer (ops/lb/haproxy.cfg), run for real in front of the service and of a stand-in
replica: only its listening address, its replica list and its file paths are rewritten for loopback."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx2 as httpx
import pytest

from tests.servers import ROOT, free_port, installed, start_api, stop, wait_until

LB = ROOT / "ops" / "lb"
OTHER = "127.0.0.2"  # a second client address: every 127/8 address is loopback


def render(backend_port: int, port: int, folder: Path, *, config: str | None = None, admin: str | None = None) -> Path:
    """The shipped config on loopback: listening on `port`, one replica at `backend_port`, its files under
    `folder` (`admin`: another list of admin sources)."""
    shutil.copytree(LB / "errors", folder / "errors")
    (folder / "admin-sources.lst").write_text(admin or (LB / "admin-sources.lst").read_text())
    text = config if config is not None else (LB / "haproxy.cfg").read_text()
    text = text.replace("/etc/haproxy/", f"{folder}/").replace("bind :8080", f"bind 127.0.0.1:{port}")
    text = text.replace("resolvers docker init-addr none ", "").replace(" resolvers docker init-addr none", "")
    text = re.sub(r"server-template api \d+ api:8000", f"server api1 127.0.0.1:{backend_port}", text)
    out = folder / "haproxy.cfg"
    out.write_text(text)
    return out


def run_balancer(cfg: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [installed("haproxy", "haproxy"), "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )

    def up() -> bool:  # the replica checked healthy: requests pass
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=30)
    return proc


class Replica(BaseHTTPRequestHandler):
    """A stand-in replica: /readyz answers; every other request is recorded, then the connection is closed
    without an answer (a replica killed mid-request), or answered 200 when `answer` is set."""

    seen: ClassVar[list[tuple[str, str, dict[str, str]]]] = []
    answer = False

    def log_message(self, *args: object) -> None:
        pass

    def _handle(self) -> None:
        if self.path == "/readyz":
            self._reply(b'{"ready": true}')
            return
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        type(self).seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        if type(self).answer:
            self._reply(b"{}")
        else:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

    def _reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _handle


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[tuple[str, type[Replica]]]:
    """The shipped balancer in front of a stand-in replica: its URL and the replica's class."""
    handler = type("OneReplica", (Replica,), {"seen": [], "answer": False})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = free_port()
    proc = run_balancer(render(server.server_address[1], port, tmp_path, admin="127.0.0.1\n"), port)
    yield f"http://127.0.0.1:{port}", handler
    proc.kill()
    proc.wait()
    server.shutdown()


def test_an_admin_call_is_never_sent_twice_but_reads_and_events_are_retried(
    stand_in: tuple[str, type[Replica]],
) -> None:
    url, replica = stand_in
    with httpx.Client(timeout=10) as c:
        r = c.post(f"{url}/admin/models/m/rollback", headers={"X-API-Key": "k"})
        assert r.status_code == 502 and r.json()["error"]["code"] == "bad_gateway"
        assert [p for _, p, _ in replica.seen] == ["/admin/models/m/rollback"]  # once: it may have applied
        replica.seen.clear()
        c.post(f"{url}/recommend", json={"queries": []})
        c.post(f"{url}/events", json={"events": []})
        assert [p for _, p, _ in replica.seen] == ["/recommend"] * 3 + ["/events"] * 3  # the first try and 2 more


def test_the_client_address_is_passed_on_and_never_taken_from_the_client(
    stand_in: tuple[str, type[Replica]],
) -> None:
    url, replica = stand_in
    replica.answer = True
    with httpx.Client(timeout=10, transport=httpx.HTTPTransport(local_address=OTHER)) as c:
        assert c.post(f"{url}/recommend", json={}, headers={"X-Forwarded-For": "6.6.6.6"}).status_code == 200
    [(_, _, headers)] = replica.seen
    assert headers["x-forwarded-for"] == OTHER


def test_metrics_and_admin_are_closed_to_outsiders_and_errors_are_json(stand_in: tuple[str, type[Replica]]) -> None:
    url, replica = stand_in
    replica.answer = True
    with httpx.Client(timeout=10, transport=httpx.HTTPTransport(local_address=OTHER)) as outsider:
        r = outsider.get(f"{url}/metrics")
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        r = outsider.post(f"{url}/admin/reload")  # 127.0.0.2 is not in this admin list
        assert r.status_code == 403 and r.headers["content-type"] == "application/json"
        r = outsider.get(f"{url}/models", headers={"X-Big": "x" * 20_000})  # over the api's 16 KiB
        assert r.status_code == 431 and r.json()["error"]["code"] == "headers_too_large"
    with httpx.Client(timeout=10) as listed:
        assert listed.post(f"{url}/admin/reload").status_code == 200  # from a listed address: passed on
    assert [p for _, p, _ in replica.seen] == ["/admin/reload"]


def _slow_bodies(port: int, count: int) -> list[socket.socket]:
    """`count` connections from 127.0.0.1, each a request whose body never finishes."""
    held = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        held.append(s)
        with contextlib.suppress(OSError):  # past the balancer's limit for this address: closed at once
            s.sendall(
                b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"queries": ['
            )
    return held


@pytest.mark.slow
def test_one_client_holding_many_slow_bodies_denies_nobody_else(tiny_artifacts: Path, tmp_path: Path) -> None:
    """300 unfinished bodies from one address (more than the api's 256 connections a peer) must not make
    the other clients' requests 503: the balancer holds them itself and limits that address alone."""
    api, url = start_api(tiny_artifacts)
    lb: subprocess.Popen[bytes] | None = None
    held: list[socket.socket] = []
    try:
        port = free_port()
        lb = run_balancer(render(int(url.rsplit(":", 1)[1]), port, tmp_path), port)
        held = _slow_bodies(port, 300)
        statuses = []
        body = {"model": "sasrec-tiny", "queries": [{"user_id": "u1", "k": 3}]}
        with httpx.Client(timeout=20, transport=httpx.HTTPTransport(local_address=OTHER)) as other:
            for _ in range(20):
                statuses.append(other.post(f"http://127.0.0.1:{port}/recommend", json=body).status_code)
        assert statuses == [200] * 20
        # The api itself saw none of the unfinished bodies: the balancer waits for a body before it
        # chooses a replica.
        assert json.loads(httpx.get(f"{url}/readyz").text)["ready"] is True
    finally:
        for s in held:
            s.close()
        if lb is not None:
            lb.kill()
            lb.wait()
        stop(api)
