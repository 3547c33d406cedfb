from __future__ import annotations

from fastapi import APIRouter

from app.deps import AdminKey, ServicesDep
from app.routers.docs import errors
from app.schemas import ReloadReport

router = APIRouter(tags=["admin"])


@router.post("/admin/reload", response_model=ReloadReport, responses=errors(401, 403), dependencies=[AdminKey])
async def reload(services: ServicesDep) -> ReloadReport:
    """Pick up new artifact versions without downtime: load and warm beside the old, then swap. With
    several workers, every worker reloads; the answer comes once all have (or after SEQSERVE_RELOAD_WAIT_S)."""
    if services.coordinator is None:
        report = await services.registry.reload(services.settings.artifacts_dir)
        return ReloadReport(**report, workers={"self": services.registry.versions()}, all_workers=True)
    report, complete, workers = await services.coordinator.reload_everywhere(services.settings.reload_wait_s)
    return ReloadReport(
        **report, workers={str(pid): w.versions for pid, w in sorted(workers.items())}, all_workers=complete
    )
