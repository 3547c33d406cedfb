from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.schemas import Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request) -> JSONResponse:
    """Ready when at least one model serves; names every artifact that failed to load, and why."""
    reg = request.app.state.registry
    body = Readiness(ready=bool(reg.names), models=reg.names, broken=reg.broken)
    return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)
