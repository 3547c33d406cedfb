from __future__ import annotations

import secrets

from fastapi import APIRouter, Header, Request

from app.errors import Forbidden
from app.schemas import ReloadReport

router = APIRouter(tags=["admin"])


def require_key(request: Request, key: str | None) -> None:
    expected = request.app.state.settings.admin_api_key
    if not expected:
        raise Forbidden("admin endpoints are disabled: set SEQSERVE_ADMIN_API_KEY", ["header", "x-api-key"])
    if key is None or not secrets.compare_digest(key.encode(), expected.encode()):
        raise Forbidden("missing or wrong API key", ["header", "x-api-key"])


@router.post("/admin/reload", response_model=ReloadReport)
async def reload(request: Request, x_api_key: str | None = Header(default=None)) -> ReloadReport:
    """Pick up new artifact versions without downtime: load and warm beside the old, then swap."""
    require_key(request, x_api_key)
    settings = request.app.state.settings
    report = await request.app.state.registry.reload(settings.artifacts_dir, settings.default_model)
    return ReloadReport(**report)
