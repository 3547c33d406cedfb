"""Prometheus metrics, request ids and JSON logs."""

from __future__ import annotations

import contextvars
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """One registry per app, so several apps in one process (tests) never collide."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("seqserve_requests_total", "HTTP requests", ["endpoint", "model", "status"],
                                registry=self.registry)
        self.latency = Histogram("seqserve_request_seconds", "HTTP request latency", ["endpoint", "model"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("seqserve_batch_size", "Queries per model call", ["model"],
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        self.batch_seconds = Histogram("seqserve_batch_seconds", "Model call time", ["model"],
                                       buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge("seqserve_queue_depth", "Requests waiting for a model call", ["model"],
                                 registry=self.registry)
        self.rejected = Counter("seqserve_rejected_total", "Requests refused or failed, by reason", ["reason"],
                                registry=self.registry)

    def on_batch(self, model: str) -> Callable[[int, float], None]:
        def record(size: int, seconds: float) -> None:
            self.batch_size.labels(model).observe(size)
            self.batch_seconds.labels(model).observe(seconds)

        return record

    def render(self) -> bytes:
        return generate_latest(self.registry)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id.get(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def install_observability(app: FastAPI, metrics: Metrics) -> None:
    log = logging.getLogger("app.access")

    @app.middleware("http")
    async def observe(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        rid = rid[:128]
        token = request_id.set(rid)
        t0 = time.perf_counter()
        try:
            response = await call_next(request)
        finally:
            request_id.reset(token)
        route = request.scope.get("route")
        endpoint = getattr(route, "path", "unmatched")
        model = getattr(request.state, "model", "-")
        seconds = time.perf_counter() - t0
        metrics.requests.labels(endpoint, model, str(response.status_code)).inc()
        metrics.latency.labels(endpoint, model).observe(seconds)
        response.headers["X-Request-ID"] = rid
        if endpoint not in ("/metrics", "/healthz", "/readyz"):
            token = request_id.set(rid)
            log.info("%s %s %d %.1fms", request.method, endpoint, response.status_code, seconds * 1000)
            request_id.reset(token)
        return response

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        reg = app.state.registry
        for name, b in [*reg.rec_batchers.items(), *reg.loc_batchers.items()]:
            metrics.queue_depth.labels(name).set(b.depth)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
