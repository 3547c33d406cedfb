"""Domain errors and their mapping to HTTP statuses and the one JSON error shape, in one place."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.engine.batcher import BatchTimeoutError, QueueFullError
from app.engine.recommender import UnknownUserError

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


def error_body(code: str, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or []}}


def _jsonable_details(errors: Any) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        out.append({"loc": list(e.get("loc", [])), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    return out


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def domain(_: Request, exc: DomainError) -> JSONResponse:
        details = [{"loc": exc.loc, "msg": exc.message, "type": exc.code}] if exc.loc else []
        return JSONResponse(error_body(exc.code, exc.message, details), status_code=exc.status)

    @app.exception_handler(UnknownUserError)
    async def unknown_user(_: Request, exc: UnknownUserError) -> JSONResponse:
        loc: list[str | int] = ["body", "queries", exc.position, "user_id"]
        return JSONResponse(
            error_body("unknown_user", str(exc), [{"loc": loc, "msg": str(exc), "type": "unknown_user"}]),
            status_code=404,
        )

    @app.exception_handler(QueueFullError)
    async def overloaded(_: Request, exc: QueueFullError) -> JSONResponse:
        body = error_body("overloaded", f"server busy: {exc}; retry shortly")
        return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(BatchTimeoutError)
    async def timed_out(_: Request, exc: BatchTimeoutError) -> JSONResponse:
        return JSONResponse(error_body("timeout", str(exc)), status_code=504)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = _jsonable_details(exc.errors())
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        return JSONResponse(
            error_body("invalid_request", f"{where}: {first['msg']}", details), status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
    async def http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        code = codes.get(exc.status_code, "http_error")
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(error_body("internal_error", "internal server error"), status_code=500)
