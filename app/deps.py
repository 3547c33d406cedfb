"""Typed FastAPI dependencies: the one place that reads the app's state.

Routers declare what they need (`ServicesDep`, a parsed body, a key check) and never touch
`app.state`; the request path's endpoints (app/routers/plain.py) call `services_of` and
`parse_body` themselves, as FastAPI's handling of a route was half of their cost. Every dependency
is `async def`: FastAPI runs a plain `def` one in a worker thread, and those thread hops were the
largest cost of a no-op request in the profile (docs/decisions/request-path-trims.md). Request bodies are
parsed here in one pass (`model_validate_json` on the raw bytes) by the app's own bounded models, so
validation and the OpenAPI document share one set of limits.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, TypeVar

from fastapi import Depends, Header, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, SecretStr

from app import bodies
from app.answering import off_loop
from app.catalog import CatalogView
from app.errors import Forbidden, Unauthorized
from app.loaded import LoadedModels, Served
from app.observability import Metrics
from app.production.loop import ProductionLoop
from app.production.online import ServedLists
from app.production.traffic import VersionTraffic
from app.production.trials import AnswerContext, ShadowWork
from app.schemas import EventsRequest, RequestModels, bounded
from app.settings import Settings
from app.store import HistoryStore, ProductionState
from app.workers import Coordinator

M = TypeVar("M", bound=BaseModel)


@dataclass
class Services:
    """What one app holds: built by create_app, filled by the lifespan."""

    settings: Settings
    metrics: Metrics
    loaded: LoadedModels
    schemas: RequestModels = field(init=False)  # the task routes' bodies: set by the app factory
    route_paths: dict[str, str] = field(default_factory=dict)  # route name -> its path
    events_route: str | None = None  # the route whose models' histories POST /events writes
    histories: HistoryStore | None = None  # live events: what /events writes and by-user queries read
    state: ProductionState | None = None  # pins, candidates, trials, arrivals, online sums
    coordinator: Coordinator | None = None  # reloads across this host's workers; None: this process alone
    lists: ServedLists | None = None  # what this worker served by user, for online evaluation; None: off
    shadows: ShadowWork | None = None  # shadow candidates' work off the response path
    production: ProductionLoop | None = None  # online scoring, shared figures, the promotion rule
    traffic: VersionTraffic = field(default_factory=VersionTraffic)  # this worker's answers per version
    catalog: CatalogView | None = None  # hidden items and recent takes, given to every loaded engine

    def __post_init__(self) -> None:
        self.schemas = bounded(self.settings.limits)


def answer_context(
    services: Services, served: Served, *, abandoned: Callable[[], bool] | None, keyed: bool
) -> AnswerContext:
    """What answering one request of `served`'s route needs from the app: the store, its deadline, online
    evaluation's keeping, and, for a key holder's request, the traffic counts. Probation's start when the
    live version is on it and events are keyed (no NDCG@10 is read on probation otherwise: nothing to keep)."""
    probation = None
    if services.settings.events_api_key is not None:
        probation = services.loaded.choices.on_probation(served.name, served.version)
    return AnswerContext(
        store=services.histories,
        timeout_s=services.settings.request_timeout_s,
        abandoned=abandoned,
        lists=services.lists,
        shadows=services.shadows,
        metrics=services.metrics,
        probation=probation,
        traffic=services.traffic if keyed else None,
    )


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def get_services(request: Request) -> Services:
    return services_of(request)


ServicesDep = Annotated[Services, Depends(get_services)]


async def parse_body(request: Request, model: type[M]) -> M:
    """The body validated by `model`; a 422 naming each bad field (loc starts with "body"), at most
    bodies.MAX_DETAILS of them. A large body is parsed in a worker thread at a bounded cost (app/bodies.py)."""
    ctype = request.headers.get("content-type", "")
    if ctype and not bodies.is_json(ctype):
        raise RequestValidationError([{"loc": ("body",), "msg": "the body must be JSON", "type": "content_type"}])
    raw = await request.body()
    if len(raw) <= bodies.INLINE_BYTES:
        return bodies.parse(raw, model)
    budget = services_of(request).schemas.budget(model)
    return await off_loop(bodies.parse_large, raw, model, budget=budget)


# The body dependency is a leaf (it finds the schemas through services_of, not ServicesDep): FastAPI
# solves every node of a route's dependency tree on every request (recursion, a cache key and scope
# checks per node); a node less is measurably cheaper (docs/decisions/request-path-trims.md).
async def events_body(request: Request) -> EventsRequest:
    return await parse_body(request, services_of(request).schemas.events)


EventsBody = Annotated[EventsRequest, Depends(events_body)]


def check_key(
    expected: SecretStr | tuple[SecretStr, ...] | None,
    given: str | None,
    *,
    what: str,
    required: bool,
    missing: str = "missing X-API-Key header",
) -> None:
    """A constant-time API key check against one key or any of several. No key set: allowed unless
    `required` (then the endpoint is off)."""
    keys = expected if isinstance(expected, tuple) else (() if expected is None else (expected,))
    if not keys:
        if required:
            raise Forbidden(f"{what} endpoints are disabled: set SEQSERVE_ADMIN_API_KEY", ["header", "x-api-key"])
        return
    if not given:
        raise Unauthorized(missing, ["header", "x-api-key"])
    if not holds_key(keys, given):
        raise Forbidden("wrong API key", ["header", "x-api-key"])


def holds_key(keys: tuple[SecretStr, ...], given: str | None) -> bool:
    """Whether `given` is one of `keys`, in constant time over them all."""
    if not given:
        return False
    matched = False
    for key in keys:  # every key compared, so the time says nothing about which one nearly matched
        matched |= secrets.compare_digest(given.encode(), key.get_secret_value().encode())
    return matched


async def require_admin(services: ServicesDep, x_api_key: Annotated[str | None, Header()] = None) -> None:
    check_key(services.settings.admin_api_key, x_api_key, what="admin", required=True)


async def require_writer(services: ServicesDep, x_api_key: Annotated[str | None, Header()] = None) -> None:
    check_key(services.settings.events_api_key, x_api_key, what="events", required=False)


def check_history_reader(settings: Settings, given: str | None) -> None:
    """Reading a stored history: allowed when no key guards histories, else X-API-Key must be the
    events key or the read key."""
    check_key(
        settings.history_keys,
        given,
        what="history",
        required=False,
        missing="missing X-API-Key header: stored histories are private here (send the history in the query instead)",
    )


async def require_history_reader(services: ServicesDep, x_api_key: Annotated[str | None, Header()] = None) -> None:
    check_history_reader(services.settings, x_api_key)


AdminKey = Depends(require_admin)
WriterKey = Depends(require_writer)
HistoryReaderKey = Depends(require_history_reader)
