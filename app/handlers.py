"""Every error the service answers, rendered as the one JSON error shape:
{"error": {"code", "message", "details": [{"loc", "msg", "type"}]}}."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Match

from app.batcher import AbandonedError, BatcherStoppedError, BatchTimeoutError, QueueFullError
from app.bodies import MAX_DETAILS, BodyError, is_json
from app.errors import RETRY, DomainError
from app.observability import Metrics
from app.store import StoreError
from models.queries import QueryError

log = logging.getLogger(__name__)
JSON = "application/json"
CLIENT_CLOSED = 499

# Errors raised below the serving layer (batcher, store): status, code, client message, headers.
# The store's own message may name hosts or files: clients get the fixed message, the log the detail.
ERROR_TABLE: dict[type[Exception], tuple[int, str, str | None, dict[str, str] | None]] = {
    QueueFullError: (503, "overloaded", None, RETRY),
    BatchTimeoutError: (504, "timeout", None, None),
    BatcherStoppedError: (503, "model_reloading", "the model was just swapped out; retry", RETRY),
    StoreError: (503, "store_unavailable", "history store unavailable; retry shortly", RETRY),
    AbandonedError: (CLIENT_CLOSED, "client_disconnected", None, None),  # nobody receives it; the metrics count it
}


def allowed(request: Request) -> str:
    """Every method some route of this path answers: a path of several routes (PUT and DELETE of one
    resource) would otherwise name only the first route's methods in a 405's Allow."""
    methods: set[str] = set()
    for route in getattr(request.app.state, "method_routes", ()):
        match, _ = route.matches({**request.scope, "method": "\0"})  # no method matches: PARTIAL for the path
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def json_response(obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """A JSON response serialized once, by orjson (the body is never re-validated)."""
    return Response(orjson.dumps(obj), status_code=status, headers=headers, media_type=JSON)


def error_json(code: str, message: str, details: list[dict[str, Any]] | None = None) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message, "details": details or []}})


def validation_details(errors: Any) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        out.append({"loc": list(e.get("loc", [])), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    return out


def install_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    def reply(
        status: int,
        code: str,
        message: str,
        details: list[dict[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        metrics.rejected.labels(code).inc()
        return Response(error_json(code, message, details), status_code=status, headers=headers, media_type=JSON)

    @app.exception_handler(DomainError)
    async def domain(request: Request, exc: DomainError) -> Response:
        details = exc.details or ([{"loc": exc.loc, "msg": exc.message, "type": exc.code}] if exc.loc else [])
        return reply(exc.status, exc.code, exc.message, details, exc.headers)

    @app.exception_handler(QueryError)
    async def query(request: Request, exc: QueryError) -> Response:
        return reply(exc.status, exc.code, str(exc), [{"loc": exc.loc, "msg": str(exc), "type": exc.code}])

    for kind, (status, code, fixed, headers) in ERROR_TABLE.items():

        def make(status: int, code: str, fixed: str | None, headers: dict[str, str] | None) -> Any:
            async def handler(request: Request, exc: Exception) -> Response:
                if fixed is not None:
                    log.error("%s: %s", code, exc)  # the detail stays in the log
                return reply(status, code, fixed or str(exc), headers=headers)

            return handler

        app.add_exception_handler(kind, make(status, code, fixed, headers))

    def invalid_reply(request: Request, details: list[dict[str, Any]], total: int) -> Response:
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        message = f"{where}: {first['msg']}"
        if total > len(details):
            message += f" ({total - len(details)} more problems not listed)"
        ctype = request.headers.get("content-type", "")
        if ctype and not is_json(ctype):
            # curl -d sends a form content type: the JSON body was never parsed.
            message += f" (the body was sent as {ctype.split(';')[0]}; send Content-Type: application/json)"
        return reply(422, "invalid_request", message, details)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        return invalid_reply(request, validation_details(errors[:MAX_DETAILS]), len(errors))

    @app.exception_handler(BodyError)
    async def invalid_body(request: Request, exc: BodyError) -> Response:
        return invalid_reply(request, exc.details, exc.total)

    @app.exception_handler(StarletteHTTPException)
    async def http(request: Request, exc: StarletteHTTPException) -> Response:
        codes = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        code = codes.get(exc.status_code, "http_error")
        headers = exc.headers
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": allowed(request)}
        return reply(exc.status_code, code, str(exc.detail), headers=headers)

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, exc: ClientDisconnect) -> Response:
        # The client hung up (mid-body, or while its answer was computed): its own outcome, never a 500.
        # 499 is nginx's "client closed request"; nobody receives it, the metrics and access log do.
        log.info("client disconnected before its answer: %s %s", request.method, request.url.path)
        metrics.rejected.labels("client_disconnected").inc()
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error")
        return reply(500, "internal_error", "internal server error")
