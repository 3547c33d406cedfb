"""Pure ASGI middleware: request ids, metrics and the access log; the body size limit.

Plain ASGI callables rather than Starlette's BaseHTTPMiddleware, which wraps every request in
extra tasks and streams (docs/decisions/request-path-trims.md).
"""

from __future__ import annotations

import itertools
import logging
import os
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.observability import Metrics, request_id

QUIET = frozenset({"/metrics", "/healthz", "/readyz"})
# An ASGI scope extension the service's server (app/server.py) sets on every request: a callable that
# is true once the client's connection is closed. The batcher asks it before running a request.
CONNECTION_CLOSED = "seqserve.connection_closed"
# Made-up request ids: a random prefix per process and a counter, unique across workers and
# restarts without uuid4's cost on every request (2.4% of a no-op request in the profile).
_PREFIX = os.urandom(8).hex()
_COUNTER = itertools.count()
log = logging.getLogger("app.access")


class Observe:
    """Request id (taken from X-Request-ID or made up, returned in the response, carried by the logs),
    request counts and latency per endpoint and model, and one access-log line per request."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = ""
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                rid = value[:128].decode("latin-1")
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
            model = scope.get("state", {}).get("model", "-")
            self.metrics.observe_request(endpoint, model, status, seconds)
            if endpoint not in QUIET and log.isEnabledFor(logging.INFO):
                log.info("%s %s %d %.1fms", scope["method"], endpoint, status, seconds * 1000)
            request_id.reset(token)


class BodyLimit:
    """413 with the JSON error shape when a body exceeds `max_bytes`.

    Content-Length is checked first; a streamed body is read up to the limit before the app sees
    it (the framework would turn an error raised mid-read into a 400).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

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
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._reject(send)
                return
            await self.app(scope, receive, send)
            return
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
                await self._reject(send)
                return
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

    async def _reject(self, send: Send) -> None:
        from app.handlers import error_json

        body = error_json("payload_too_large", f"request body exceeds {self.max_bytes} bytes")
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
