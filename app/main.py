"""App factory: settings -> lifespan opens the store and loads the models -> routers, errors, middleware."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import torch
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi_offline import FastAPIOffline

from app.catalog import CatalogView
from app.choices import VersionChoices
from app.deps import Services
from app.handlers import install_error_handlers
from app.loaded import LoadedModels, resolve_device
from app.middleware import BodyBudget, BodyLimit, Observe
from app.observability import AccessLog, Metrics, configure_logging
from app.production.loop import ProductionLoop
from app.production.online import ServedLists
from app.production.trials import ShadowWork
from app.routers import admin, catalog, console, events, health, history, metrics, models, similar
from app.routers.plain import PlainRouter
from app.routers.tasks import TaskRoute, live_route, plain_router, task_routes
from app.schemas import bounded, components
from app.settings import LoopPolicy, Settings, get_settings
from app.store import RedisStore, SQLiteStore, StoreError, distinct, open_store
from app.workers import Coordinator, WorkerSync
from models.engine import EngineOptions

log = logging.getLogger("app")
DOCS_ASSETS = "/docs-assets"


# Request bodies a route's dependency parses: their schemas are added to the document (app.schemas.components).
BODIES = (
    admin.PinRequest,
    admin.CandidateRequest,
    catalog.HideRequest,
    catalog.UnhideRequest,
    catalog.NamedFilterRequest,
    similar.SimilarRequest,
)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    services = Services(settings=settings, metrics=Metrics(), loaded=LoadedModels())
    access = AccessLog(json_lines=settings.json_logs)
    routes = task_routes()
    services.schemas = bounded(settings.limits, {r.name: r.body(settings.limits) for r in routes})
    services.route_paths = {r.name: r.path for r in routes}
    services.events_route = live_route(routes)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services.histories = services.state = _open_store(settings)  # one backend serves both
        services.catalog = CatalogView(window_s=settings.fallback_window_s, min_takes=settings.fallback_min_takes)
        services.catalog.begin(services.state)
        services.loaded = _loaded_models(settings, services)
        await _start_production(settings.loop, services)
        services.loaded.load_all(settings.artifacts_dir)
        if not services.loaded.names:
            log.warning("no model loaded from %s; /readyz answers 503", settings.artifacts_dir)
        _join_workers(settings, services)
        assert services.production is not None
        periodic = [asyncio.create_task(_housekeeping(services)), asyncio.create_task(services.production.scoring())]
        yield
        access.flush()
        await _shut_down(services, periodic)

    # FastAPI's native OpenTelemetry looks up the global providers on every request (4% of the event
    # loop in the serving profile, docs/decisions/request-path-trims.md) and this service configures none: its
    # metrics are Prometheus (/metrics), its traces the request id in the JSON logs.
    # No slash redirects: Starlette builds the Location from the Host header, so `POST /events/` with a
    # forged Host would send a client that follows it (body and API key) to another host.
    # /docs loads Swagger UI from assets installed with fastapi-offline: no request leaves the machine
    # (FastAPI's own page fetches them from a CDN). No /redoc: its bundle still loads a logo from
    # cdn.redoc.ly (seen in tests/app/test_browser.py).
    app = FastAPIOffline(
        docs_url="/docs",
        redoc_url=None,
        static_url=DOCS_ASSETS,
        title="seqserve",
        version="0.2.0",
        lifespan=lifespan,
        redirect_slashes=False,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.services = services
    install_error_handlers(app, services.metrics)
    plain = _mount_routes(app, settings, services, routes)
    # Outermost first: every response, a 413 included, gets a request id and is counted.
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, budget=BodyBudget(settings.max_body_bytes_in_flight)
    )
    app.add_middleware(Observe, metrics=services.metrics, access=access)

    def openapi() -> dict[str, Any]:
        """The generated document plus the request bodies the dependencies parse, with this app's bounds."""
        if app.openapi_schema is None:
            documented = [route for hot in plain for route in hot.documented.routes]
            doc = get_openapi(title=app.title, version=app.version, routes=[*documented, *app.routes])
            doc.setdefault("components", {}).setdefault("schemas", {}).update(components(services.schemas, *BODIES))
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _open_store(settings: Settings) -> SQLiteStore | RedisStore | None:
    try:
        return open_store(**settings.store_args())
    except (StoreError, OSError, ValueError) as exc:
        # The service still starts: queries that carry their own history are answered; the ones by
        # user_id, and /events, answer 503 and /readyz says the store is unavailable.
        log.error("history store not available: %s", exc)
        return None


def _loaded_models(settings: Settings, services: Services) -> LoadedModels:
    """The (still empty) loaded models on the settings' device, with its threads set."""
    device = resolve_device(settings.device)
    threads = settings.model_threads(device.type)
    if threads is not None:
        torch.set_num_threads(threads)
    return LoadedModels(
        options=EngineOptions(
            device=device,
            half=settings.half_precision and device.type == "cuda",
            live_events=settings.live_events,
            trace=settings.trace_models,
            coarse_from=settings.coarse_ranking_from or None,
        ),
        policy=settings.batch_policy(device.type),
        histories=services.histories,
        on_batch=services.metrics.on_batch,
        on_open=services.catalog.apply if services.catalog is not None else None,
        load_timeout_s=settings.load_timeout_s,
        choices=VersionChoices(
            probation=settings.probation.probation_s > 0, holdback_share=settings.probation.probation_holdback
        ),
    )


async def _start_production(policy: LoopPolicy, services: Services) -> None:
    """Online evaluation, shadow work and the production loop, with the pins and candidates the store
    holds applied before the first load."""
    if policy.online_eval:
        services.lists = ServedLists(window_s=policy.online_window_s, max_lists=policy.online_max_lists)
    services.shadows = ShadowWork(policy.shadow_max_in_flight)
    services.production = ProductionLoop(
        policy=policy,
        loaded=services.loaded,
        state=services.state,
        metrics=services.metrics,
        lists=services.lists,
        traffic=services.traffic,
    )
    await asyncio.to_thread(services.production.begin)
    await services.production.follow_choices()


def _join_workers(settings: Settings, services: Services) -> None:
    try:
        sync = WorkerSync(settings.shared_dir / "workers")
        services.coordinator = Coordinator(services.loaded, sync, settings.artifacts_dir)
        services.coordinator.announce()
    except OSError as exc:
        log.error("no shared folder for the workers (%s): POST /admin/reload reaches this process only", exc)


async def _shut_down(services: Services, periodic: list[asyncio.Task[None]]) -> None:
    for task in periodic:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
    if services.coordinator is not None:
        services.coordinator.sync.withdraw()
    if services.shadows is not None:
        await services.shadows.drain()
    await services.loaded.close()
    for store in distinct(services.histories, services.state):
        store.close()


def _mount_routes(app: FastAPI, settings: Settings, services: Services, routes: list[TaskRoute]) -> list[PlainRouter]:
    """Every router in the order requests try them; -> the request path's plain routers (their FastAPI
    twins write the document)."""
    # Routes are tried in order: the request path's come first (last, /bench/noop's walk was 28% of its
    # in-process cost, docs/decisions/request-path-trims.md). They are plain Starlette routes
    # (app/routers/plain.py). bench/serving/noop.py mounts its no-op right behind /recommend.
    plain = [plain_router(r, body_name=services.schemas.requests[r.name].model.__name__) for r in routes]
    for hot in plain:
        app.router.routes.extend(hot.routes)
    modules = [
        events,
        history,
        models,
        similar,
        health,
        metrics,
        admin,
        catalog,
        *([console] if settings.console else []),
    ]
    for module in modules:
        app.include_router(module.router)
    if settings.console:
        app.router.routes.append(console.assets)
    # Every route with its methods, as declared: a 405's Allow names each method of its path (app/handlers.py).
    app.state.method_routes = [r for hot in plain for r in hot.routes] + [r for m in modules for r in m.router.routes]
    # FastAPI adds its docs routes first: behind the API they no longer cost every request four path
    # matches (docs/decisions/request-path-trims.md). The sort is stable.
    docs = {app.openapi_url, "/docs", app.swagger_ui_oauth2_redirect_url, DOCS_ASSETS}
    app.router.routes.sort(key=lambda route: getattr(route, "path", None) in docs)
    return plain


async def _housekeeping(services: Services) -> None:
    """Each worker, every SEQSERVE_HOUSEKEEPING_S: sets its own queue-depth gauges (with several workers,
    /metrics sums every worker's), its models' publish times and their offline figures against their
    baselines, then the production loop's tick (version
    choices, a reload another worker was asked for, the shared online figures, the promotion rule)."""
    production = services.production
    assert production is not None
    while True:
        await asyncio.sleep(services.settings.housekeeping_s)
        try:
            services.metrics.set_queue_depths(services.loaded.queue_depths())
            manifests = {n: m.engine.manifest for n, m in services.loaded.models.items()}
            services.metrics.set_published({n: m.created or 0.0 for n, m in manifests.items()})
            services.metrics.set_vs_baseline(
                {n: r for n, m in manifests.items() if (r := m.vs_best_baseline) is not None}
            )
            services.metrics.forget_dead_workers()
            if services.shadows is not None:
                services.metrics.count_shadow(*services.shadows.take())
            await production.tick(services.settings.artifacts_dir, services.coordinator)
            if services.catalog is not None:
                await services.catalog.tick(services.state, services.loaded)
        except Exception:  # a bad file or a failed reload must not end the loop
            log.exception("housekeeping failed; trying again in %.1f s", services.settings.housekeeping_s)


def app_from_env() -> FastAPI:
    """Entry point for `uvicorn --factory app.main:app_from_env`."""
    s = get_settings()
    configure_logging(s.log_level, s.json_logs)
    return create_app(s)
