"""Admin: reload, the versions each model serves (pin, unpin, roll back) and its candidate trials
(start, promote, retire). Needs X-API-Key."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path as FsPath
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from app.deps import AdminKey, Services, ServicesDep, parse_body
from app.errors import BrokenVersion, NoOlderVersion, NoTrial, StoreUnavailable, UnknownModel
from app.production.loop import ProductionLoop
from app.routers.docs import body_doc, errors
from app.schemas import CandidateInfo, ModelNamePath, Strict
from app.store import Candidate, Mode, StoreError
from models.artifact import versions as version_folders

# The bodies of these routes (app/schemas.py keeps what several routes share).


class ReloadReport(BaseModel):
    loaded: dict[str, str] = Field(description="model name -> version swapped in")
    unchanged: dict[str, str]
    failed: dict[str, str] = Field(description="name/version -> why; the current version keeps serving")
    workers: dict[str, dict[str, str]] = Field(description="each worker process (by pid) -> model -> version it serves")
    all_workers: bool = Field(description="every worker reached this reload before the answer (SEQSERVE_RELOAD_WAIT_S)")
    deleted: list[str] = Field(
        default_factory=list, description="name/version folders deleted beyond SEQSERVE_KEEP_VERSIONS"
    )
    candidates: dict[str, str] = Field(
        default_factory=dict, description="model name -> the candidate version tried beside the live one here"
    )


class TrialMove(BaseModel):
    name: str
    action: Literal["started", "promoted", "retired"]
    candidate: CandidateInfo | None = Field(description="the candidate after the call")
    pinned: str | None
    reason: str
    reload: ReloadReport


class VersionMove(BaseModel):
    name: str
    pinned: str | None = Field(description="the version pinned now; null: the newest that loads")
    serving: str | None = Field(description="the version this worker serves after the move")
    reload: ReloadReport


class CandidateRequest(Strict):
    version: str = Field(
        min_length=1, max_length=64, pattern=r"^\d{8}T\d{6}Z(-\d+)?$", description="a version folder's name"
    )
    mode: Mode = Field(
        description="canary: `share` of the users (sticky by user id) get its answers; shadow: it also scores "
        "the by-user queries off the response path, its answers never returned; interleave: every by-user answer "
        "mixes its list with the live version's (Team-Draft), and the item the user takes credits the side that "
        "alone put it there (the rule then decides by a sign test over users)"
    )
    share: float | None = Field(
        default=None, gt=0, le=1, description="canary: the share of users it answers (default SEQSERVE_CANARY_SHARE)"
    )


class PinRequest(Strict):
    version: str = Field(
        min_length=1, max_length=64, pattern=r"^\d{8}T\d{6}Z(-\d+)?$", description="a version folder's name"
    )


async def pin_body(request: Request) -> PinRequest:
    return await parse_body(request, PinRequest)


PinBody = Annotated[PinRequest, Depends(pin_body)]


async def candidate_body(request: Request) -> CandidateRequest:
    return await parse_body(request, CandidateRequest)


CandidateBody = Annotated[CandidateRequest, Depends(candidate_body)]

router = APIRouter(tags=["admin"])


@router.post("/admin/reload", response_model=ReloadReport, responses=errors(401, 403), dependencies=[AdminKey])
async def reload(services: ServicesDep) -> ReloadReport:
    """Pick up new artifact versions without downtime: load and warm beside the old, then swap. With
    several workers, every worker reloads; the answer comes once all have (or after SEQSERVE_RELOAD_WAIT_S).
    Other hosts on the same store reload on their next housekeeping tick."""
    if services.production is not None:  # the other hosts on this store reload on their next tick
        await asyncio.to_thread(services.production.ask_reload)
    return await _reload_everywhere(services)


async def _reload_everywhere(services: Services) -> ReloadReport:
    if services.production is not None:
        await services.production.adopt_new_versions(services.settings.artifacts_dir)
    if services.coordinator is None:
        report = await services.loaded.reload(services.settings.artifacts_dir)
        workers, complete = {"self": services.loaded.versions()}, True
    else:
        report, complete, found = await services.coordinator.reload_everywhere(services.settings.reload_wait_s)
        workers = {str(pid): w.versions for pid, w in sorted(found.items())}
    deleted: list[str] = []
    keep = services.settings.keep_versions
    if keep and complete:  # only once every worker has moved off what would be deleted
        in_use = {f"{n}/{v}" for w in workers.values() for n, v in w.items()}
        deleted = await asyncio.to_thread(
            partial(services.loaded.prune, services.settings.artifacts_dir, keep, in_use=in_use)
        )
    return ReloadReport(**report, workers=workers, all_workers=complete, deleted=deleted)


@router.post(
    "/admin/models/{name}/candidate",
    response_model=TrialMove,
    openapi_extra=body_doc("CandidateRequest"),
    responses=errors(401, 403, 404, 409, 422, 503),
    dependencies=[AdminKey],
)
async def start_trial(services: ServicesDep, name: ModelNamePath, body: CandidateBody) -> TrialMove:
    """Try `version` beside the live version of `name` on live traffic, as a canary (a sticky share of the
    users get its answers) or a shadow (it scores the same by-user queries; its answers are never
    returned). The live version is pinned, so it keeps serving everyone else. Replaces a running trial."""
    folders = _folders(services, name, want=body.version)
    live = services.loaded.models.get(name)
    if live is not None and live.version == body.version:
        raise NoTrial(f"version {body.version!r} is the live version of {name!r}", ["body", "version"])
    await _loads(services, name, next(f for f in folders if f.name == body.version))
    share = (body.share or services.settings.canary_share) if body.mode == "canary" else 1.0
    production = _production(services)
    try:
        await production.start(
            name,
            Candidate(body.version, body.mode, share, time.time()),
            live_version=live.version if live is not None else None,
            reason="admin call",
        )
    except StoreError:
        raise StoreUnavailable("history store unavailable: the trial could not be kept; retry shortly") from None
    return await _after_trial(services, name, "started", "admin call")


@router.post(
    "/admin/models/{name}/promote",
    response_model=TrialMove,
    responses=errors(401, 403, 404, 409, 503),
    dependencies=[AdminKey],
)
async def promote(services: ServicesDep, name: ModelNamePath) -> TrialMove:
    """Serve the running candidate of `name` to everyone (it becomes the pinned version)."""
    return await _settle(services, name, promote=True)


@router.post(
    "/admin/models/{name}/retire",
    response_model=TrialMove,
    responses=errors(401, 403, 404, 409, 503),
    dependencies=[AdminKey],
)
async def retire(services: ServicesDep, name: ModelNamePath) -> TrialMove:
    """End the running trial of `name`; the live version goes on serving everyone."""
    return await _settle(services, name, promote=False)


def _production(services: Services) -> ProductionLoop:
    if services.state is None or services.production is None:
        raise StoreUnavailable("history store unavailable: a version choice could not be kept; retry shortly")
    return services.production


async def _settle(services: Services, name: str, *, promote: bool) -> TrialMove:
    _folders(services, name)
    production = _production(services)
    try:
        await production.read_choices()
        running = production.choices.candidates.get(name)
        if running is None:
            raise NoTrial(f"model {name!r} has no candidate on trial", ["path", "name"])
        done = await production.settle(name, running.version, promote=promote, reason="admin call")
    except StoreError:
        raise StoreUnavailable("history store unavailable: a version choice could not be kept; retry shortly") from None
    if not done:
        raise NoTrial(f"the trial of {name!r} ended or changed meanwhile", ["path", "name"])
    return await _after_trial(services, name, "promoted" if promote else "retired", "admin call")


async def _after_trial(services: Services, name: str, action: str, reason: str) -> TrialMove:
    """Every worker follows the store's new choices; the answer says where this one stands."""
    production = _production(services)
    try:
        await production.read_choices()
    except StoreError:
        raise StoreUnavailable("history store unavailable; retry shortly") from None
    report = await _reload_everywhere(services)
    running = production.choices.candidates.get(name)
    return TrialMove(
        name=name,
        action=action,  # type: ignore[arg-type]
        candidate=CandidateInfo.of(running),
        pinned=production.choices.pins.get(name),
        reason=reason,
        reload=report,
    )


@router.post(
    "/admin/models/{name}/pin",
    response_model=VersionMove,
    openapi_extra=body_doc("PinRequest"),
    responses=errors(401, 403, 404, 409, 422, 503),
    dependencies=[AdminKey],
)
async def pin(services: ServicesDep, name: ModelNamePath, body: PinBody) -> VersionMove:
    """Serve `version` of `name` on every worker and every host sharing the history store, until unpinned;
    the choice is kept in the store, so it survives restarts."""
    folders = _folders(services, name, want=body.version)
    await _loads(services, name, next(f for f in folders if f.name == body.version))
    return await _move(services, name, body.version)


@router.post(
    "/admin/models/{name}/unpin",
    response_model=VersionMove,
    responses=errors(401, 403, 404, 503),
    dependencies=[AdminKey],
)
async def unpin(services: ServicesDep, name: ModelNamePath) -> VersionMove:
    """Back to the newest version of `name` that loads."""
    _folders(services, name)
    return await _move(services, name, None)


@router.post(
    "/admin/models/{name}/rollback",
    response_model=VersionMove,
    responses=errors(401, 403, 404, 409, 503),
    dependencies=[AdminKey],
)
async def rollback(services: ServicesDep, name: ModelNamePath) -> VersionMove:
    """Pin the version before the one serving here: the next older on disk that loads (each checked first)."""
    folders = _folders(services, name)
    served = services.loaded.models.get(name)
    names = [f.name for f in folders]
    start = names.index(served.version) + 1 if served is not None and served.version in names else len(names)
    for folder in folders[start:]:  # the newest older version that loads: checked here, never pinned broken
        if f"{name}/{folder.name}" in services.loaded.broken:
            continue
        if await asyncio.to_thread(services.loaded.verify, name, folder) is None:
            return await _move(services, name, folder.name)
    raise NoOlderVersion(f"no version of {name!r} older than the one serving loads to roll back to", ["path", "name"])


async def _loads(services: Services, name: str, folder: FsPath) -> None:
    """Refuse (409) a version that does not load before any choice names it."""
    reason = await asyncio.to_thread(services.loaded.verify, name, folder)
    if reason is not None:
        raise BrokenVersion(f"version {folder.name!r} of {name!r} does not load: {reason}", ["body", "version"])


def _folders(services: Services, name: str, *, want: str | None = None) -> list[FsPath]:
    folders = version_folders(services.settings.artifacts_dir / name)
    if not folders:
        raise UnknownModel(f"no versions of model {name!r} on disk", ["path", "name"])
    if want is not None and want not in {f.name for f in folders}:
        raise UnknownModel(f"model {name!r} has no version {want!r} on disk", ["body", "version"])
    return folders


async def _move(services: Services, name: str, version: str | None) -> VersionMove:
    production = _production(services)
    try:
        await production.pin(name, version)
    except StoreError:
        raise StoreUnavailable("history store unavailable: a version choice could not be kept; retry shortly") from None
    report = await _reload_everywhere(services)
    served = services.loaded.models.get(name)
    return VersionMove(
        name=name,
        pinned=version,
        serving=served.version if served is not None else None,
        reload=report,
    )
