from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.schemas import Readiness
from app.store import HistoryStore, StoreError

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


async def store_state(request: Request) -> str | None:
    """None when the history store answers, else why not."""
    store: HistoryStore | None = request.app.state.store
    if store is None:
        return str(request.app.state.store_error)
    try:
        await asyncio.to_thread(store.ping)
    except StoreError as exc:
        return str(exc)
    return None


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request) -> JSONResponse:
    """Ready when at least one model serves and the history store answers; names every artifact
    that failed to load, and why."""
    reg = request.app.state.registry
    fault = await store_state(request)
    kind = request.app.state.settings.history_store
    body = Readiness(ready=bool(reg.names) and fault is None, models=reg.names, broken=reg.broken,
                     history_store=f"{kind}: ok" if fault is None else f"{kind}: {fault}")
    return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)
