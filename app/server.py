"""The service's process: uvicorn with connection limits it lacks (`python -m app.server`).

uvicorn's httptools parser has no header size limit and uvicorn no deadline to receive a request, so
one client could hold a descriptor forever or grow a header without bound. `GuardedHttpTools` is
uvicorn's httptools protocol (passed as `Config(http=...)`, uvicorn's way to choose a protocol class)
with three limits, each a setting (docs/decisions/connection-limits.md):
  - a header larger than SEQSERVE_MAX_HEADER_BYTES: 431, closed;
  - a request (headers and body) not received within SEQSERVE_REQUEST_READ_TIMEOUT_S of its first byte
    (of the connection, for its first request): 408, closed;
  - more than SEQSERVE_MAX_CONNECTIONS open connections in one process, or more than
    SEQSERVE_MAX_CONNECTIONS_PER_CLIENT from one peer address: the new one is let in for /healthz and
    /readyz alone (the reserve): anything else gets 503 as soon as its path is read, and it must send
    its request within RESERVE_READ_TIMEOUT_S. While HEALTH_RESERVE reserve connections wait for their
    request, a new one closes the oldest waiting: a probe sends its request at once, so what an
    attacker parks there cannot keep a probe out, from any number of addresses or from the probe's own.
Idle keep-alive connections are closed after SEQSERVE_KEEP_ALIVE_S, as before.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import weakref
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.handlers import error_json
from app.middleware import CONNECTION_CLOSED
from app.settings import SettingsError, get_settings

log = logging.getLogger("app.server")
LINGER_S = 1.0  # how long a refused connection's remaining input is read and dropped before it is closed
REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


# Past the connection caps, connections are let in for the health endpoints alone: at most this many
# waiting for their request at once (the oldest waiting one is closed for a new one), and at most twice
# as many in all (the others are being answered, then closed): a full server still answers its
# orchestrator's probes (docs/decisions/connection-limits.md).
HEALTH_RESERVE = 256
HEALTH_PATHS = frozenset({b"/healthz", b"/readyz"})
RESERVE_READ_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ConnectionLimits:
    max_header_bytes: int = 16 * 1024
    read_timeout_s: float = 15.0
    max_connections: int = 1024
    max_connections_per_client: int = 256  # open connections from one peer address


# Open connections per peer address, per process (one event loop per process); reserve connections
# are not counted here.
_PER_CLIENT: Counter[str] = Counter()
# The process's reserve connections, and of them those still waiting for their request, oldest first.
_RESERVED: set[GuardedHttpTools] = set()
_WAITING: dict[GuardedHttpTools, None] = {}


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header size limit, a request deadline and a connection cap.

    Per request it only notes when the request began: one sweep per process and loop, every quarter
    of the deadline (at most 1 s), closes the connections whose request is late, instead of a timer
    armed and cancelled for every request. What the protocol costs a request is measured in
    docs/BENCHMARKS.md, "What can a hostile client cost the service?".
    """

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._head_bytes = 0  # bytes of chunks that held nothing but an unfinished header block
        self._heads = 0  # header blocks completed on this connection
        self._chunk = 0  # length of the chunk being parsed
        self._refused = self._lingering = False
        self._in_head = True  # receiving a request's start line and headers
        self.since: float | None = None  # when the request being received began (loop time)
        self._peer: str | None = None  # counted in _PER_CLIENT under this address
        self._health_only = False  # let in past a cap: only /healthz and /readyz are answered
        self._refusal = ""  # what a reserve connection asking for anything else is told
        self._read_timeout_s = limits.read_timeout_s

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = self.client[0] if self.client else ""
        if _PER_CLIENT[peer] >= self.limits.max_connections_per_client:
            self._reserve("too many open connections from this address; retry shortly")
        elif len(self.connections) - len(_RESERVED) > self.limits.max_connections:
            self._reserve("too many open connections; retry shortly")
        else:
            _PER_CLIENT[peer] += 1
            self._peer = peer
        if self.transport.is_closing():
            return
        self.since = self.loop.time()  # an idle new connection is a request that has not arrived in time
        if self.loop not in _SWEPT:
            _SWEPT.add(self.loop)
            interval = min(1.0, self.limits.read_timeout_s / 4)
            self.loop.call_later(interval, _sweep, self.loop, self.connections, interval)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the rest of a refused request: read and dropped
        if self.since is None and self._in_head:
            self.since = self.loop.time()  # the first byte of a kept-alive connection's next request
        was_head, heads, self._chunk = self._in_head, self._heads, len(data)
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        if not was_head or self._heads != heads:  # a request ended in this chunk and the next began in it
            self._head_bytes = 0
            return
        # The whole chunk was start line and headers (of a request still missing its blank line).
        self._head_bytes += len(data)
        if self._head_bytes > self.limits.max_header_bytes:
            self._refuse(
                431, "headers_too_large", f"request line and headers exceed {self.limits.max_header_bytes} bytes"
            )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._refused = False
        self.scope["extensions"] = {CONNECTION_CLOSED: self.transport.is_closing}  # type: ignore[dict-item]

    def _reserve(self, message: str) -> None:
        """Let this connection in for the health endpoints alone (`message`: why anything else is refused)."""
        if len(_WAITING) >= HEALTH_RESERVE:
            oldest = next(iter(_WAITING))
            oldest._leave_reserve()
            oldest.transport.abort()  # it sent nothing in all this time: no answer owed
        if len(_RESERVED) >= 2 * HEALTH_RESERVE:  # the rest are being answered: closed within moments
            self._refuse_at_connect(message)
            return
        self._health_only, self._refusal = True, message
        self._read_timeout_s = min(self._read_timeout_s, RESERVE_READ_TIMEOUT_S)
        _RESERVED.add(self)
        _WAITING[self] = None

    def _leave_reserve(self) -> None:
        if self._health_only:
            _WAITING.pop(self, None)
            _RESERVED.discard(self)
            self.connections.discard(self)

    def _refuse_at_connect(self, message: str) -> None:
        # Refused connections linger a second to deliver the 503; they hold no slot meanwhile, or a
        # client reconnecting fast would fill the cap with its own refusals.
        self.connections.discard(self)
        self._release_peer()
        self._refuse(503, "overloaded", message, retry=True)

    def _release_peer(self) -> None:
        if self._peer is not None:
            _PER_CLIENT[self._peer] -= 1
            if _PER_CLIENT[self._peer] <= 0:
                del _PER_CLIENT[self._peer]
            self._peer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._release_peer()
        self._leave_reserve()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads += 1
        if self._health_only:
            _WAITING.pop(self, None)
            if self.url.split(b"?", 1)[0] not in HEALTH_PATHS:
                self._refused = True
                self._leave_reserve()
                self._refuse(503, "overloaded", self._refusal, retry=True)
                return
            super().on_headers_complete()
            self.cycle.keep_alive = False  # answered, then closed: a reserve slot is not kept alive
            return
        # A block that ended in this chunk was not counted above; it can only be too large if the
        # chunk (with what came before it) is, and then it is counted exactly.
        limit = self.limits.max_header_bytes
        if self._head_bytes + self._chunk > limit and (
            len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers) > limit
        ):
            self._refused = True  # never reaches the app; the parser's later callbacks are ignored
            self._refuse(431, "headers_too_large", f"request line and headers exceed {limit} bytes")
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()
            # uvicorn pauses reading while a body waits for the app, and the last chunk can leave it
            # paused: then a client that hangs up is never noticed, and the batcher runs its request.
            # With the message whole, reading on is safe: a pipelined next request pauses it again.
            self.flow.resume_reading()
        self.since = None
        self._in_head, self._head_bytes = True, 0

    def late(self, now: float) -> bool:
        return self.since is not None and now - self.since > self._read_timeout_s

    def expire(self) -> None:
        self.since = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # the app answered early (a 413, say) and the body never came
            return
        self._refuse(408, "request_timeout", f"the request was not received within {self._read_timeout_s:g} s")

    def _refuse(self, status: int, code: str, message: str, *, retry: bool = False) -> None:
        log.info("closing a connection from %s: %d %s", self.client, status, code)
        body = error_json(code, message)
        head = [
            b"HTTP/1.1 %d %s\r\n" % (status, REASONS[status]),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n",
        ]
        if retry:
            head.append(b"retry-after: 1\r\n")
        self.transport.write(b"".join([*head, b"\r\n", body]))
        self.since = None
        self._leave_reserve()  # a refused connection holds no reserve slot while it lingers
        # A lingering close: closing with the client's unread bytes in our buffer sends a reset, which
        # can destroy the answer before the client reads it. Stop writing, drop what still comes, then close.
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


_SWEPT: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def _sweep(loop: asyncio.AbstractEventLoop, connections: set[Any], interval: float) -> None:
    """Close the connections whose request is late; again in `interval` seconds."""
    now = loop.time()
    for conn in [c for c in connections if isinstance(c, GuardedHttpTools) and c.late(now)]:
        conn.expire()
    loop.call_later(interval, _sweep, loop, connections, interval)


def main(app: str = "app.main:app_from_env") -> None:
    """Serve the app factory `app` (an import string) with the
    settings' host, port, workers and connection limits. The benches serve theirs with it."""
    try:
        s = get_settings()
    except SettingsError as exc:  # its text names each variable and never a value
        raise SystemExit(f"seqserve: {exc}") from None
    server = s.server
    if server.workers > 1:
        # Every worker counts into this folder and /metrics sums them (prometheus-client's multiprocess
        # mode); emptied at each start, so a previous run's counts never add in.
        metrics_dir = Path(os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(s.shared_dir / "metrics")))
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
    limits = ConnectionLimits(
        server.max_header_bytes,
        server.request_read_timeout_s,
        server.max_connections,
        server.max_connections_per_client,
    )
    uvicorn.run(
        app,
        factory=True,
        host=server.host,
        port=server.port,
        workers=server.workers,
        http=partial(GuardedHttpTools, limits=limits),  # type: ignore[arg-type]
        timeout_keep_alive=int(server.keep_alive_s),
        timeout_graceful_shutdown=int(server.drain_s),
        forwarded_allow_ips=server.forwarded_allow_ips,
        access_log=False,  # the service writes its own access log, with request ids (app/middleware.py)
        log_level=server.log_level.lower(),
    )


if __name__ == "__main__":
    main()
