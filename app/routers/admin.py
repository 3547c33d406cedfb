from __future__ import annotations

from fastapi import APIRouter

from app.deps import AdminKey, ServicesDep
from app.routers.docs import errors
from app.schemas import ReloadReport

router = APIRouter(tags=["admin"])


@router.post("/admin/reload", response_model=ReloadReport, responses=errors(401, 403), dependencies=[AdminKey])
async def reload(services: ServicesDep) -> ReloadReport:
    """Pick up new artifact versions without downtime: load and warm beside the old, then swap."""
    report = await services.registry.reload(services.settings.artifacts_dir)
    return ReloadReport(**report)
