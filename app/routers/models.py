from __future__ import annotations

from fastapi import APIRouter

from app.deps import ServicesDep
from app.schemas import ModelInfo, ModelsResponse

router = APIRouter(tags=["models"])


# The test figures, and whether the model beats the best simple baseline of its own run.
SHOWN_METRICS = ("test", "train_seconds", "best_epoch", "full_ndcg10_vs_best_baseline")


@router.get("/models", response_model=ModelsResponse)
async def list_models(services: ServicesDep) -> ModelsResponse:
    reg, preferred = services.registry, services.settings.default_model
    infos = []
    for name, served in sorted(reg.models.items()):
        m, engine = served.engine.manifest, served.engine
        infos.append(
            ModelInfo(
                name=name,
                kind=m.kind,
                task=m.task,
                version=served.version,
                created_at=m.created_at or None,
                catalog_size=engine.catalog_size,
                device=str(engine.device),
                scoring=engine.scoring,
                actions=engine.actions,
                metrics={k: m.metrics[k] for k in SHOWN_METRICS if k in m.metrics},
                fields=engine.item_fields,
            )
        )
    return ModelsResponse(
        defaults={path: reg.default(name, preferred) for name, path in services.route_paths.items()},
        models=infos,
        broken=reg.broken,
    )
