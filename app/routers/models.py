from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path

from app.deps import ServicesDep
from app.errors import UnknownModel
from app.routers.docs import errors
from app.schemas import ModelInfo, ModelsResponse, VersionInfo, VersionsResponse
from models.artifact import ArtifactError, read_manifest
from models.artifact import versions as version_folders

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


@router.get("/models/{name}/versions", response_model=VersionsResponse, responses=errors(404, 422))
async def list_versions(
    services: ServicesDep, name: Annotated[str, Path(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9._-]+$")]
) -> VersionsResponse:
    """Every version of a model on disk, newest first: its state on this worker, whether it is pinned,
    when it was trained and its offline test figures."""
    folders = version_folders(services.settings.artifacts_dir / name)
    if not folders:
        raise UnknownModel(f"no versions of model {name!r} on disk", ["path", "name"])
    reg = services.registry
    served = reg.models.get(name)
    pinned = reg.pins.get(name)
    out = []
    for folder in folders:
        key = f"{name}/{folder.name}"
        try:
            manifest = read_manifest(folder)
            created, metrics = (
                manifest.created_at or None,
                {k: manifest.metrics[k] for k in SHOWN_METRICS if k in manifest.metrics},
            )
        except ArtifactError:
            created, metrics = None, {}
        state: Literal["serving", "kept", "broken"] = "kept"
        if served is not None and served.version == folder.name:
            state = "serving"
        elif key in reg.broken:
            state = "broken"
        out.append(
            VersionInfo(
                version=folder.name,
                created_at=created,
                state=state,
                pinned=folder.name == pinned,
                metrics=metrics,
                reason=reg.broken.get(key) if state == "broken" else None,
            )
        )
    return VersionsResponse(name=name, pinned=pinned, versions=out)
