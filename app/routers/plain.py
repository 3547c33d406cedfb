"""The request path's routes: served as plain Starlette routes, documented as FastAPI routes.

FastAPI's per-request handling of a route (its dependency solving, three exit stacks, the
included-route context, its exception wrapper) was half of a no-op request's event-loop CPU:
245 -> 116 us in-process (docs/decisions/plain-routes.md). A plain endpoint takes the Request and
gets its services and its parsed body from app.deps (`services_of`, `parse_body`), the functions
the typed dependencies of the other routes call; what it raises reaches the app's exception
handlers like any route's error. The OpenAPI document is built from `documented`, FastAPI routes of
the same endpoints that are never mounted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Scope

from app.middleware import CONNECTION_CLOSED

Endpoint = Callable[[Request], Awaitable[Response]]


def closed_connection(request: Request) -> Callable[[], bool] | None:
    """True once the client's connection is closed (set by the service's server, app/server.py)."""
    found: Callable[[], bool] | None = request.scope.get("extensions", {}).get(CONNECTION_CLOSED)
    return found


class LeanRoute(Route):
    """A Starlette route that leaves itself in the scope, as FastAPI's routes do: the metrics and the
    access log label a request by its route's path template."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match != Match.NONE:
            child_scope["route"] = self
        return match, child_scope


class PlainRouter:
    """POST endpoints of the request path: `routes` to serve, `documented` for the OpenAPI document."""

    def __init__(self, *, tags: list[str], include_in_schema: bool = True) -> None:
        self.routes: list[LeanRoute] = []
        self.documented = APIRouter(tags=list(tags), include_in_schema=include_in_schema)

    def post(self, path: str, **doc: Any) -> Callable[[Endpoint], Endpoint]:
        """Serve `endpoint(request) -> Response` at POST `path`; `doc` takes FastAPI's route options
        (response_model, responses, openapi_extra) for the document only."""

        def add(endpoint: Endpoint) -> Endpoint:
            self.routes.append(LeanRoute(path, endpoint, methods=["POST"]))
            self.documented.add_api_route(path, endpoint, methods=["POST"], **doc)
            return endpoint

        return add
