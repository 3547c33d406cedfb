"""Domain errors and their mapping to HTTP statuses and the one JSON error shape, in one place."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.engine.batcher import BatchTimeoutError, QueueFullError
from app.engine.recommender import UnknownUserError
from app.store import StoreError

log = logging.getLogger(__name__)


class DomainError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, loc: list[str | int] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc


class UnknownModel(DomainError):
    status, code = 404, "unknown_model"


class ModelUnavailable(DomainError):
    status, code = 503, "model_unavailable"


class LimitExceeded(DomainError):
    status, code = 422, "limit_exceeded"


class Forbidden(DomainError):
    status, code = 403, "forbidden"


class StoreUnavailable(DomainError):
    status, code = 503, "store_unavailable"


class InvalidEvents(DomainError):
    """Every event of a request was rejected; the details name each one."""

    status, code = 422, "invalid_events"

    def __init__(self, message: str, details: list[dict[str, Any]]) -> None:
        super().__init__(message, ["body", "events"])
        self.details = details


def error_body(code: str, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or []}}


def _reply(
    request: Request | None, status: int, code: str, message: str,
    details: list[dict[str, Any]] | None = None, headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    metrics = getattr(request.app.state, "metrics", None) if request is not None else None
    if metrics is not None:
        metrics.rejected.labels(code).inc()
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def domain(request: Request, exc: DomainError) -> JSONResponse:
        details = getattr(exc, "details", None) or (
            [{"loc": exc.loc, "msg": exc.message, "type": exc.code}] if exc.loc else []
        )
        return _reply(request, exc.status, exc.code, exc.message, details)

    @app.exception_handler(UnknownUserError)
    async def unknown_user(request: Request, exc: UnknownUserError) -> JSONResponse:
        loc: list[str | int] = ["body", "queries", exc.position, "user_id"]
        return _reply(request, 404, "unknown_user", str(exc), [{"loc": loc, "msg": str(exc), "type": "unknown_user"}])

    @app.exception_handler(StoreError)
    async def store_down(request: Request, exc: StoreError) -> JSONResponse:
        log.error("history store: %s", exc)
        message = f"history store unavailable: {exc}"
        return _reply(request, 503, "store_unavailable", message, headers={"Retry-After": "1"})

    @app.exception_handler(QueueFullError)
    async def overloaded(request: Request, exc: QueueFullError) -> JSONResponse:
        return _reply(request, 503, "overloaded", f"server busy: {exc}; retry shortly", headers={"Retry-After": "1"})

    @app.exception_handler(BatchTimeoutError)
    async def timed_out(request: Request, exc: BatchTimeoutError) -> JSONResponse:
        return _reply(request, 504, "timeout", str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {"loc": list(e.get("loc", [])), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        message = f"{where}: {first['msg']}"
        ctype = request.headers.get("content-type", "")
        if ctype and "json" not in ctype:
            # curl -d sends a form content type: the JSON body was never parsed.
            message += f" (the body was sent as {ctype.split(';')[0]}; send Content-Type: application/json)"
        return _reply(request, 422, "invalid_request", message, details)

    @app.exception_handler(StarletteHTTPException)
    async def http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        code = codes.get(exc.status_code, "http_error")
        return _reply(request, exc.status_code, code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _reply(request, 500, "internal_error", "internal server error")


class BodyLimit:
    """ASGI middleware: 413 with the JSON error shape when a body exceeds `max_bytes`.

    Content-Length is checked first; a streamed body is read up to the limit before the app sees
    it (the framework would turn an error raised mid-read into a 400).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._reject(send)
                return
            await self.app(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            msg = await receive()
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
        response = JSONResponse(
            error_body("payload_too_large", f"request body exceeds {self.max_bytes} bytes"), status_code=413
        )
        await response({"type": "http"}, _empty_receive, send)


async def _empty_receive() -> Message:
    return {"type": "http.disconnect"}
