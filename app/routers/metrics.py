from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from app.deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/metrics", include_in_schema=False)
async def prometheus(services: ServicesDep) -> Response:
    services.metrics.set_queue_depths(services.loaded.queue_depths())
    return Response(services.metrics.render(), media_type=CONTENT_TYPE_LATEST)
