"""App factory: settings -> lifespan loads the models -> routers and error handlers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI

from app.engine.registry import BatchPolicy, ModelRegistry, resolve_device
from app.errors import BodyLimit, install_error_handlers
from app.observability import Metrics, configure_logging, install_observability
from app.routers import admin, bench, events, health, models, next_location, recommend
from app.settings import Settings, get_settings
from app.store import StoreError, open_store

log = logging.getLogger("app")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        policy = BatchPolicy(settings.batching, settings.max_batch_size, settings.max_wait_ms, settings.max_queue)
        store, app.state.store_error = None, None
        try:
            store = open_store(settings.history_store, settings.history_path, settings.redis_url, settings.redis_prefix)
        except (StoreError, OSError, ValueError) as exc:
            # The service still starts: queries that carry their own history are answered; the
            # ones by user_id, and /events, answer 503 and /readyz says why.
            app.state.store_error = f"{settings.history_store}: {exc}"
            log.error("history store not available: %s", app.state.store_error)
        app.state.store = store
        registry = ModelRegistry(
            device=resolve_device(settings.device), policy=policy, on_batch=metrics.on_batch,
            half_precision=settings.half_precision, store=store,
        )
        registry.load_all(settings.artifacts_dir, settings.default_model)
        if not registry.names:
            log.warning("no model loaded from %s; /readyz answers 503", settings.artifacts_dir)
        app.state.registry = registry
        yield
        await registry.close()
        if store is not None:
            store.close()

    app = FastAPI(title="seqserve", version="0.1.0", lifespan=lifespan)
    metrics = Metrics()
    app.state.settings = settings
    app.state.metrics = metrics
    install_error_handlers(app)
    install_observability(app, metrics)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    for r in (health.router, models.router, recommend.router, events.router, next_location.router, admin.router):
        app.include_router(r)
    if settings.bench_endpoints:
        app.include_router(bench.router)
    return app


def app_from_env() -> FastAPI:
    """Entry point for `uvicorn --factory app.main:app_from_env`."""
    s = get_settings()
    if s.json_logs:
        configure_logging(s.log_level)
    else:
        logging.basicConfig(level=s.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return create_app(s)
