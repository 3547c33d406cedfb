"""Pure ASGI middleware: request ids, metrics and the access log; the body size limit.

Plain ASGI callables rather than Starlette's BaseHTTPMiddleware, which wraps every request in
extra tasks and streams (docs/decisions/request-path-trims.md).
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import os
import re
import threading
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.observability import AccessLog, Metrics, request_id

QUIET = frozenset({"/metrics", "/healthz", "/readyz"})
# An ASGI scope extension the service's server (app/server.py) sets on every request: a callable that
# is true once the client's connection is closed. The batcher asks it before running a request.
CONNECTION_CLOSED = "seqserve.connection_closed"
# Made-up request ids: a random prefix per process and a counter, unique across workers and
# restarts without uuid4's cost on every request (2.4% of a no-op request in the profile).
_PREFIX = os.urandom(8).hex()
_COUNTER = itertools.count()
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:/+=-]{1,128}")
_ADDRESS = re.compile(r"[0-9A-Fa-f:.]{1,45}")  # an IPv4 or IPv6 address


class Observe:
    """Request id (taken from X-Request-ID or made up, returned in the response, carried by the logs),
    request counts and latency per endpoint and model, and one access-log line per request."""

    def __init__(self, app: ASGIApp, metrics: Metrics, access: AccessLog | None = None) -> None:
        self.app, self.metrics = app, metrics
        self.access = access or AccessLog(json_lines=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = ""
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                # Logged and echoed: only a plain token is taken (no quotes, controls or escapes to
                # forge log lines with); anything else is replaced by a made-up id.
                if _REQUEST_ID.fullmatch(value):
                    rid = value.decode("ascii")
                break
        rid = rid or f"{_PREFIX}{next(_COUNTER):016x}"
        header = (b"x-request-id", rid.encode("latin-1"))
        status = 500
        t0 = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        token = request_id.set(rid)
        self.metrics.in_progress.inc()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.metrics.in_progress.dec()
            seconds = time.perf_counter() - t0
            route = scope.get("route")
            endpoint = getattr(route, "path", "unmatched")
            state = scope.get("state", {})
            model = state.get("model", "-")
            self.metrics.observe_request(endpoint, model, status, seconds)
            if endpoint not in QUIET and self.access.enabled():
                client = scope.get("client")  # the balancer's X-Forwarded-For, where it is trusted
                # Only an address is written: a trusted peer's header is still the client's text.
                who = client[0] if client and _ADDRESS.fullmatch(client[0]) else "-"
                self.access.write(f"{who} {scope['method']} {endpoint} {status} {seconds * 1000:.1f}ms", rid)
            request_id.reset(token)


# Bodies up to this size are not counted against the budget below: the request path's bodies are a
# few hundred bytes, and the connection cap bounds what small bodies can hold (docs/decisions/body-budget.md).
UNCOUNTED_BODY_BYTES = 64 * 1024


class BodyBudget:
    """The bytes of request bodies this process holds at once, against a cap; when the last large body
    is let go, the freed heap is handed back to the system (glibc keeps freed pages otherwise: 1 GB
    still resident after an attack of 60 unfinished 16 MB bodies, docs/decisions/body-budget.md)."""

    def __init__(self, cap: int) -> None:
        self.cap, self.held = cap, 0
        self._trim_due = False

    def take(self, n: int) -> bool:
        if self.held + n > self.cap:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n
        if n:
            self._trim_due = True
        if self.held == 0 and self._trim_due:
            self._trim_due = False
            _trim_soon()


class BodyLimit:
    """413 with the JSON error shape when a body exceeds `max_bytes`; 503 with Retry-After when taking
    a large body would put the bodies held at once over `budget`.

    Content-Length is checked first, and a large declared body reserves its whole size before a byte
    of it is read; a streamed body is read up to the limit before the app sees it (the framework
    would turn an error raised mid-read into a 400), counted chunk by chunk once it is large.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, budget: BodyBudget | None = None) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.budget = budget or BodyBudget(1 << 62)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
                break
        if declared is not None:
            size = int(declared) if declared.isdigit() else 0
            if size > self.max_bytes:
                await _reject(send, 413, "payload_too_large", f"request body exceeds {self.max_bytes} bytes")
                return
            if size <= UNCOUNTED_BODY_BYTES:
                await self.app(scope, receive, send)
                return
            if not self.budget.take(size):
                await self._busy(send)
                return
            try:
                await self.app(scope, receive, send)
            finally:
                self.budget.give(size)
            return
        held = [0]  # what this streamed body holds of the budget, given back however the request ends
        try:
            await self._streamed(scope, receive, send, held)
        finally:
            self.budget.give(held[0])

    async def _streamed(self, scope: Scope, receive: Receive, send: Send, held: list[int]) -> None:
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":  # gone mid-body: never hand the app a truncated body
                await send({"type": "http.response.start", "status": 499, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            if msg["type"] != "http.request":
                break
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await _reject(send, 413, "payload_too_large", f"request body exceeds {self.max_bytes} bytes")
                return
            if size > UNCOUNTED_BODY_BYTES:
                if not self.budget.take(size - held[0]):
                    await self._busy(send)
                    return
                held[0] = size
            if not msg.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _busy(self, send: Send) -> None:
        await _reject(
            send,
            503,
            "overloaded",
            f"request bodies in flight hold {self.budget.held} of {self.budget.cap} bytes; retry shortly",
            extra=[(b"retry-after", b"1")],
        )


async def _reject(
    send: Send, status: int, code: str, message: str, *, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    from app.handlers import error_json

    body = error_json(code, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_LIBC: ctypes.CDLL | None = None
_last_trim = 0.0
_trim_pending = False


def _trim_soon() -> None:
    """malloc_trim(0) in a thread, at most once a second: one asked for sooner runs when the second is
    up, so the last release of an attack is always followed by a trim (glibc only; elsewhere nothing)."""
    global _LIBC, _last_trim, _trim_pending
    wait = _last_trim + 1.0 - time.monotonic()
    if wait > 0:
        if not _trim_pending:
            _trim_pending = True
            asyncio.get_running_loop().call_later(wait, _trim_soon)
        return
    _trim_pending = False
    _last_trim = time.monotonic()
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - glibc has it; another libc does not
        except (OSError, AttributeError):
            return
    threading.Thread(target=_LIBC.malloc_trim, args=(0,), name="malloc-trim", daemon=True).start()
