from __future__ import annotations

from fastapi import APIRouter, Request

from app.schemas import ModelInfo, ModelsResponse

router = APIRouter(tags=["models"])


@router.get("/models", response_model=ModelsResponse)
async def list_models(request: Request) -> ModelsResponse:
    reg = request.app.state.registry
    infos = []
    for name, served in sorted([*reg.recommenders.items(), *reg.locators.items()]):
        m = served.art.manifest
        metrics = m.get("metrics", {})
        infos.append(
            ModelInfo(
                name=name, kind=m["kind"], task=m.get("task", "recommend"), version=str(m["version"]),
                created_at=m.get("created_at"), catalog_size=served.catalog_size, device=str(served.device),
                metrics={k: metrics[k] for k in ("test", "train_seconds", "best_epoch") if k in metrics},
            )
        )
    return ModelsResponse(
        default=reg.default, default_next_location=reg.default_locator, models=infos, broken=reg.broken
    )
