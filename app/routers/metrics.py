from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from app.deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/metrics", include_in_schema=False)
async def prometheus(services: ServicesDep) -> Response:
    for name, served in services.registry.models.items():
        services.metrics.queue_depth.labels(name).set(served.batcher.depth)
    return Response(services.metrics.render(), media_type=CONTENT_TYPE_LATEST)
