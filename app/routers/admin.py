"""Admin: reload, and the versions each model serves (pin, unpin, roll back). Needs X-API-Key."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path as FsPath
from typing import Annotated

from fastapi import APIRouter, Path

from app.deps import AdminKey, PinBody, Services, ServicesDep
from app.errors import NoOlderVersion, StoreUnavailable, UnknownModel
from app.routers.docs import body_doc, errors
from app.schemas import ReloadReport, VersionMove
from app.store import StoreError
from models.artifact import versions as version_folders

router = APIRouter(tags=["admin"])
ModelName = Annotated[str, Path(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9._-]+$")]


@router.post("/admin/reload", response_model=ReloadReport, responses=errors(401, 403), dependencies=[AdminKey])
async def reload(services: ServicesDep) -> ReloadReport:
    """Pick up new artifact versions without downtime: load and warm beside the old, then swap. With
    several workers, every worker reloads; the answer comes once all have (or after SEQSERVE_RELOAD_WAIT_S)."""
    return await _reload_everywhere(services)


async def _reload_everywhere(services: Services) -> ReloadReport:
    if services.coordinator is None:
        report = await services.registry.reload(services.settings.artifacts_dir)
        workers, complete = {"self": services.registry.versions()}, True
    else:
        report, complete, found = await services.coordinator.reload_everywhere(services.settings.reload_wait_s)
        workers = {str(pid): w.versions for pid, w in sorted(found.items())}
    deleted: list[str] = []
    keep = services.settings.keep_versions
    if keep and complete:  # only once every worker has moved off what would be deleted
        in_use = {f"{n}/{v}" for w in workers.values() for n, v in w.items()}
        deleted = await asyncio.to_thread(
            partial(services.registry.prune, services.settings.artifacts_dir, keep, in_use=in_use)
        )
    return ReloadReport(**report, workers=workers, all_workers=complete, deleted=deleted)


@router.post(
    "/admin/models/{name}/pin",
    response_model=VersionMove,
    openapi_extra=body_doc("PinRequest"),
    responses=errors(401, 403, 404, 422, 503),
    dependencies=[AdminKey],
)
async def pin(services: ServicesDep, name: ModelName, body: PinBody) -> VersionMove:
    """Serve `version` of `name` on every worker and every host sharing the history store, until unpinned;
    the choice is kept in the store, so it survives restarts."""
    _folders(services, name, want=body.version)
    return await _move(services, name, body.version)


@router.post(
    "/admin/models/{name}/unpin",
    response_model=VersionMove,
    responses=errors(401, 403, 404, 503),
    dependencies=[AdminKey],
)
async def unpin(services: ServicesDep, name: ModelName) -> VersionMove:
    """Back to the newest version of `name` that loads."""
    _folders(services, name)
    return await _move(services, name, None)


@router.post(
    "/admin/models/{name}/rollback",
    response_model=VersionMove,
    responses=errors(401, 403, 404, 409, 503),
    dependencies=[AdminKey],
)
async def rollback(services: ServicesDep, name: ModelName) -> VersionMove:
    """Pin the version before the one serving here (the next older on disk that is not known broken)."""
    folders = _folders(services, name)
    served = services.registry.models.get(name)
    names = [f.name for f in folders]
    start = names.index(served.version) + 1 if served is not None and served.version in names else len(names)
    older = [v for v in names[start:] if f"{name}/{v}" not in services.registry.broken]
    if not older:
        raise NoOlderVersion(f"no version of {name!r} older than the one serving to roll back to", ["path", "name"])
    return await _move(services, name, older[0])


def _folders(services: Services, name: str, *, want: str | None = None) -> list[FsPath]:
    folders = version_folders(services.settings.artifacts_dir / name)
    if not folders:
        raise UnknownModel(f"no versions of model {name!r} on disk", ["path", "name"])
    if want is not None and want not in {f.name for f in folders}:
        raise UnknownModel(f"model {name!r} has no version {want!r} on disk", ["body", "version"])
    return folders


async def _move(services: Services, name: str, version: str | None) -> VersionMove:
    if services.store is None:
        raise StoreUnavailable("history store unavailable: a version choice could not be kept; retry shortly")
    try:
        await asyncio.to_thread(services.store.set_pin, name, version)
        services.registry.pins = await asyncio.to_thread(services.store.pins)
    except StoreError:
        raise StoreUnavailable("history store unavailable: a version choice could not be kept; retry shortly") from None
    report = await _reload_everywhere(services)
    served = services.registry.models.get(name)
    return VersionMove(
        name=name,
        pinned=version,
        serving=served.version if served is not None else None,
        reload=report,
    )
