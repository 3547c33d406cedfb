"""The routes of the task table: each served task's row (models.tasks) names its route, and the
module of that route registers a TaskRoute under the name (`register_route`; the project's own are
imported by app/routers/__init__.py); the endpoint, its request body, its OpenAPI entries, the
default model in /models and which route /events writes for are all derived from those."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from app import answering
from app.deps import answer_context, check_history_reader, holds_key, parse_body, services_of
from app.handlers import json_response
from app.limits import Limits
from app.production import trials
from app.routers.docs import body_doc, errors
from app.routers.plain import PlainRouter, closed_connection
from app.schemas import Body
from models.tasks import TASKS


@dataclass(frozen=True)
class TaskRoute:
    """What the service needs to serve a route of the task table."""

    name: str  # models.tasks.Route.name
    path: str  # "/recommend"
    tag: str
    summary: str  # the endpoint's description in the OpenAPI document
    body: Callable[[Limits], Body]  # the request body with the app's bounds; it has `model` and `queries`
    response: type[BaseModel]  # for the document
    queries: Callable[[Any], list[Any]]  # parsed body -> the engines' queries
    result: Callable[[Any], dict[str, object]]  # an engine's result -> its JSON
    live_events: bool = False  # POST /events writes the histories of this route's models


ROUTES: dict[str, TaskRoute] = {}


def register_route(spec: TaskRoute) -> TaskRoute:
    """Add a route the task table's rows may name."""
    if spec.name in ROUTES:
        raise ValueError(f"route {spec.name!r} is registered already")
    ROUTES[spec.name] = spec
    return spec


def task_routes() -> list[TaskRoute]:
    """Every route the task table serves, in the table's order; a served task whose route no module
    registered fails here, at the app's start."""
    out: dict[str, TaskRoute] = {}
    for task in TASKS.values():
        if task.route is None or task.route in out:
            continue
        if task.route not in ROUTES:
            raise LookupError(f"task {task.name!r} is served by route {task.route!r}, which no module registered")
        out[task.route] = ROUTES[task.route]
    return list(out.values())


def plain_router(spec: TaskRoute, *, body_name: str) -> PlainRouter:
    """The route's POST endpoint: parse the body, lease the model, answer in batches.
    body_name: the component name of its bounded request body in the document."""
    router = PlainRouter(tags=[spec.tag])
    private = spec.live_events  # its models keep stored histories: answers by user_id read them

    async def endpoint(request: Request) -> Response:
        services = services_of(request)
        body = await parse_body(request, services.schemas.requests[spec.name].model)
        loaded = services.loaded
        with loaded.lease(body.model, spec.name, services.settings.default_model) as served:  # type: ignore[attr-defined]
            request.state.model = served.name
            queries = spec.queries(body)
            if (
                private
                and services.settings.history_keys
                and any(answering.subject(served, q) is not None for q in queries)
            ):
                check_history_reader(services.settings, request.headers.get("x-api-key"))
            # Only a key holder's requests count as a version's answers (probation compares them): nothing a
            # keyless client sends may move a decision (docs/decisions/sequential-tests.md).
            keys = services.settings.any_keys
            keyed = bool(keys) and holds_key(keys, request.headers.get("x-api-key"))
            with loaded.lease_candidate(served.name) as candidate:
                ctx = answer_context(services, served, abandoned=closed_connection(request), keyed=keyed)
                results, versions, ids = await trials.answer_with_candidate(served, candidate, queries, ctx)
            # Which side of a trial answered a user is for key holders only: with it, anyone could post
            # the events that favour one side (docs/decisions/online-evaluation.md).
            reveal = not keys or keyed
            out = []
            for r, v, rid in zip(results, versions, ids, strict=True):
                answer = spec.result(r)
                if rid is not None:
                    answer["recommendation_id"] = rid
                if reveal:
                    answer["version"] = v
                out.append(answer)
            return json_response({"model": served.name, "version": served.version, "results": out})

    endpoint.__name__ = spec.name  # FastAPI's operationId and the document's summary come from these
    endpoint.__doc__ = spec.summary
    router.post(
        spec.path,
        response_model=spec.response,
        openapi_extra=body_doc(body_name),
        responses=errors(*((401, 403) if spec.live_events else ()), 404, 422, 503, 504),
    )(endpoint)
    return router


def live_route(routes: Sequence[TaskRoute]) -> str | None:
    """The route whose models' histories POST /events writes, if any serves live events."""
    return next((r.name for r in routes if r.live_events), None)
