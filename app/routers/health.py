from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field
from starlette.responses import Response

from app import store_calls
from app.deps import ServicesDep
from app.handlers import json_response
from app.loaded import LoadedModels
from app.store import StoreError, distinct

# The bodies of these routes (app/schemas.py keeps what several routes share).


class Readiness(BaseModel):
    ready: bool
    models: list[str]
    broken: dict[str, str] = Field(description="artifact name/version -> why it did not load")
    degraded: dict[str, str] = Field(default_factory=dict, description="model -> why its batcher is not healthy")
    history_store: str = Field(description="'<kind>: ok', or '<kind>: unavailable'")
    warnings: dict[str, str] = Field(
        default_factory=dict,
        description="model -> what an operator should know though it serves (a version trained on too little: "
        "its offline test figure under its run's best simple baseline)",
    )


router = APIRouter(tags=["health"])


def under_baseline(reg: LoadedModels) -> dict[str, str]:
    """Serving versions whose offline test figure is under their run's best simple baseline's: a first
    training on too little data or time serves (there is nothing else to serve) and says so here, on the
    gauge seqserve_model_vs_best_baseline and in an alert (docs/decisions/cold-gate.md)."""
    out = {}
    for name, served in sorted(reg.models.items()):
        ratio = served.engine.manifest.vs_best_baseline
        if ratio is not None and ratio < 1.0:
            out[name] = (
                f"version {served.version}: offline test NDCG@10 {ratio:.2f}x its run's best simple baseline;"
                " retrain it longer or on more data"
            )
    return out


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(services: ServicesDep) -> Response:
    """Ready when at least one model serves with a healthy batcher and the history store answers.
    Names every artifact version that failed to load, and why (no paths, no exception text)."""
    reg = services.loaded
    ok = services.histories is not None and services.state is not None
    for store in distinct(services.histories, services.state):
        try:
            await store_calls.read(store.ping)  # not behind writes waiting on replicas
        except StoreError:
            ok = False
    degraded = reg.health()
    kind = services.settings.history_store
    body = Readiness(
        ready=bool(reg.names) and ok and not any(d == "batcher stopped" for d in degraded.values()),
        models=reg.names,
        broken=reg.broken,
        degraded=degraded,
        history_store=f"{kind}: {'ok' if ok else 'unavailable'}",
        warnings=under_baseline(reg),
    )
    return json_response(body.model_dump(), status=200 if body.ready else 503)
