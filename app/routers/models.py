from __future__ import annotations

from fastapi import APIRouter, Request

from app.schemas import ModelInfo, ModelsResponse

router = APIRouter(tags=["models"])


@router.get("/models", response_model=ModelsResponse)
async def list_models(request: Request) -> ModelsResponse:
    reg = request.app.state.registry
    infos = []
    for name, rec in sorted(reg.recommenders.items()):
        m = rec.art.manifest
        metrics = m.get("metrics", {})
        infos.append(
            ModelInfo(
                name=name, kind=rec.art.kind, task=m.get("task", "recommend"), version=str(m["version"]),
                created_at=m.get("created_at"), catalog_size=rec.catalog_size, device=str(rec.device),
                metrics={k: metrics[k] for k in ("test", "train_seconds", "best_epoch") if k in metrics},
            )
        )
    return ModelsResponse(default=reg.default, models=infos, broken=reg.broken)
