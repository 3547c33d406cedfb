from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from app.choices import Holdback
from app.deps import Services, ServicesDep
from app.errors import UnknownModel
from app.production.online import BUCKET_S, by_segment, figures, totals
from app.routers.docs import errors
from app.schemas import CandidateInfo, ModelNamePath
from app.store import Sums
from models.artifact import ArtifactError, read_manifest
from models.artifact import versions as version_folders
from models.engine import Actions, ItemDisplay, Neighbours, UserHistories

# The bodies of these routes (app/schemas.py keeps what several routes share).


class OnlineFigures(BaseModel):
    """Served lists scored against each user's next event (the online window)."""

    n: int = Field(description="scored lists")
    hr10: float
    hr10_ci: list[float] = Field(description="95% interval (Wilson)")
    ndcg10: float
    ndcg10_ci: list[float] = Field(
        description="95% interval (normal, lists as the unit; the promotion rule's takes users as the unit)"
    )
    mrr: float = Field(description="mean reciprocal rank within each list's top 10 (MRR@10)")
    attributed: int = Field(
        description="of the n, the lists scored by an event naming their recommendation_id; the others by the "
        "user's next event"
    )


class TrialFigures(BaseModel):
    """The running trial as the promotion rule last read it (each housekeeping tick)."""

    version: str
    mode: str
    verdict: str | None = Field(
        description="what the rule says now: promote, retire or wait; null while the rule is off "
        "(SEQSERVE_PROMOTE_MIN_LISTS=0)"
    )
    reason: str
    figures: dict[str, float | None] = Field(
        description="canary or shadow: each side's users and lists, the NDCG@10 difference and the half-width of "
        "its 95% interval (users as the unit); interleave: answers scored, users favouring the candidate, the "
        "live version or neither, and the sign test's two-sided p-value"
    )


class ProbationFigures(BaseModel):
    """A promotion on probation as probation last read it (each housekeeping tick): it is watched until it is
    confirmed or rolled back, never left undecided."""

    version: str = Field(description="the promoted version")
    replaced: str = Field(description="the version it replaced (its holdback's, and the one a rollback pins)")
    since: float = Field(description="unix seconds it was promoted")
    verdict: Literal["confirm", "roll_back", "wait"]
    reason: str
    figures: dict[str, float | None] = Field(
        description="seconds since the promotion; its users and lists; against its holdback and its floor (its "
        "reference lists on the same events): users, lists, the NDCG@10 difference, the half-width of its 95% "
        "interval (for reading) and the anytime-valid test's e-value (proof at 100)"
    )


class ExposureFigures(BaseModel):
    """What a version showed users: its by-user lists' top 10 (live, canary and interleaved answers)."""

    lists: int = Field(description="lists shown")
    items: int = Field(description="distinct items among them")
    coverage: float = Field(description="items over the version's catalog size (the live version's, if not loaded)")
    head_share: float = Field(description="share of the item slots held by the 1% most frequent items of its data")


class OnlineResponse(BaseModel):
    name: str
    bucket_s: float = Field(description="the width of each point's time bucket")
    candidate: CandidateInfo | None
    series: dict[str, list[tuple[float, int, float]]] = Field(
        description="'version/variant' -> [bucket start, scored lists, NDCG@10 of the bucket], oldest first"
    )
    totals: dict[str, OnlineFigures] = Field(description="'version/variant' -> figures over every bucket kept")
    segments: dict[str, dict[str, OnlineFigures]] = Field(
        description="'version/variant' -> segment -> figures over every bucket kept; users_known: users the "
        "serving version's artifact held, users_new: users known from live events only, users_fallback: users "
        "it did not know, answered by the fallback (a result's source); lists_fresh: lists "
        "holding an item first seen live (added by a warm retrain), lists_catalog: the others"
    )
    window_s: float = Field(description="the span `exposure` covers, up to now (SEQSERVE_ONLINE_WINDOW_S)")
    exposure: dict[str, ExposureFigures] = Field(description="'version/variant' -> what it showed over the window")
    trial: TrialFigures | None = Field(description="the running trial as the rule reads it; null without one")
    probation: ProbationFigures | None = Field(
        None, description="the promotion on probation as probation reads it; null when none is"
    )


class ModelInfo(BaseModel):
    name: str
    kind: str
    task: str
    route: str | None = Field(description="the endpoint that answers this model's queries")
    ranks: str = Field(description="what the model ranks: items, users, locations")
    exclude_seen_default: bool | None = Field(
        description="a query's exclude_seen when it does not say; null for a model without user histories"
    )
    version: str
    created_at: str | None
    catalog_size: int
    device: str
    scoring: str = Field(description="how the model's scores run: 'traced' (one graph), or 'eager' and why")
    actions: list[str] | None = Field(
        None,
        description=(
            "a social model's actions, one of which each step carries; '<-' forms are steps received from others"
        ),
    )
    metrics: dict[str, object]
    fields: list[str] = Field(default_factory=list, description="item fields a query can ask for (title, genres, ...)")
    similar_items: str | None = Field(
        default=None,
        description="where POST /similar-items takes its neighbours from (embedding, transitions, cooccurrence: "
        "chosen by the training job on validation; metrics.similar_items has its figures); null: no item answers",
    )
    candidate: CandidateInfo | None = Field(default=None, description="the version tried beside this one")
    online: dict[str, OnlineFigures] = Field(
        default_factory=dict,
        description="'version/variant' -> online figures of the live version and a candidate; variants: live, "
        "canary (the fair comparison: its users saw its lists), shadow (its lists were never shown: biased "
        "toward the live version, whose list the user acted on), interleave (the mixed answers themselves; "
        "which side won is the trial's sign test, GET /models/{name}/online)",
    )


class ModelsResponse(BaseModel):
    defaults: dict[str, str | None] = Field(
        description="endpoint path -> the model a request to it gets when it names none"
    )
    models: list[ModelInfo]
    broken: dict[str, str]


class VersionInfo(BaseModel):
    version: str
    created_at: str | None
    state: Literal["serving", "candidate", "holdback", "kept", "broken"] = Field(
        description="serving: answers requests here; candidate: tried beside it (canary, shadow or interleave); "
        "holdback: the version a promotion on probation replaced, answering a share of the users beside it; "
        "kept: on disk, not serving; broken: failed to load"
    )
    pinned: bool
    metrics: dict[str, Any] = Field(description="the offline test figures of its training run")
    reason: str | None = Field(default=None, description="why it is broken")


class VersionsResponse(BaseModel):
    name: str
    pinned: str | None
    candidate: CandidateInfo | None = None
    holdback: CandidateInfo | None = Field(
        default=None,
        description="while probation watches a promotion and no trial runs: the version it replaced, answering "
        "`share` of the users so that both are measured over the same time",
    )
    versions: list[VersionInfo] = Field(description="newest first")


router = APIRouter(tags=["models"])


# The test figures, and whether the model beats the best simple baseline of its own run.
SHOWN_METRICS = ("test", "train_seconds", "best_epoch", "full_ndcg10_vs_best_baseline", "similar_items")


@router.get("/models", response_model=ModelsResponse)
async def list_models(services: ServicesDep) -> ModelsResponse:
    reg, preferred = services.loaded, services.settings.default_model
    route_of = services.route_paths  # route name -> path
    infos = []
    for name, served in sorted(reg.models.items()):
        m, engine = served.engine.manifest, served.engine
        infos.append(
            ModelInfo(
                name=name,
                kind=m.kind,
                task=m.task,
                route=route_of.get(served.task.route) if served.task.route else None,
                ranks=served.task.ranks,
                exclude_seen_default=engine.exclude_seen_default if isinstance(engine, UserHistories) else None,
                version=served.version,
                created_at=m.created_at or None,
                catalog_size=engine.catalog_size,
                device=str(engine.device),
                scoring=engine.scoring,
                actions=engine.actions if isinstance(engine, Actions) else None,
                metrics={k: m.metrics[k] for k in SHOWN_METRICS if k in m.metrics},
                fields=engine.item_fields if isinstance(engine, ItemDisplay) else [],
                similar_items=engine.similar_source if isinstance(engine, Neighbours) else None,
                candidate=CandidateInfo.of(reg.choices.candidates.get(name)),
                online=_online(services, name, served.version),
            )
        )
    return ModelsResponse(
        defaults={path: reg.default(name, preferred) for name, path in services.route_paths.items()},
        models=infos,
        broken=reg.broken,
    )


def _online(services: Services, name: str, live_version: str) -> dict[str, OnlineFigures]:
    """The live version's online figures and its candidate's, over the time the candidate has run (or
    every bucket kept, without one)."""
    if services.production is None:
        return {}
    cand = services.loaded.choices.candidates.get(name)
    sums = totals(services.production.online.get(name, {}), since=cand.since if cand else 0.0)
    wanted = {(live_version, "live")} | ({(cand.version, cand.mode)} if cand else set())
    out = {}
    for key in sorted(wanted):
        f = figures(sums[key]) if key in sums else None
        if f is not None:
            out[f"{key[0]}/{key[1]}"] = OnlineFigures.model_validate(f.as_json())
    return out


@router.get("/models/{name}/online", response_model=OnlineResponse, responses=errors(404, 422))
async def online_series(services: ServicesDep, name: ModelNamePath) -> OnlineResponse:
    """A model's online figures over time, per version and variant (what the console draws): every
    list served by user scored against that user's next event. Canary figures are the fair comparison
    with the live version; shadow figures lean toward the live version, whose list the user saw."""
    if name not in services.loaded.models:
        raise UnknownModel(f"model {name!r} is not loaded", ["path", "name"])
    production = services.production
    rows = production.online.get(name, {}) if production is not None else {}
    by_bucket: dict[tuple[str, float], Sums] = {}
    for (_, version, variant, bucket, _), s in rows.items():  # the segments of a bucket, added up
        by_bucket.setdefault((f"{version}/{variant}", bucket), Sums()).add(s)
    series: dict[str, list[tuple[float, int, float]]] = {}
    for (key, bucket), s in sorted(by_bucket.items(), key=lambda kv: kv[0][1]):
        if s.n:
            series.setdefault(key, []).append((bucket, int(s.n), round(s.ndcg / s.n, 5)))
    every = totals(rows)
    window_s = services.settings.online_window_s
    shown = await production.exposure(name, since=time.time() - window_s) if production is not None else {}
    read = services.production.trials.get(name) if services.production is not None else None
    cand = services.loaded.choices.candidates.get(name)
    trial = None
    if read is not None and cand is not None and read[0] == cand:
        found = read[1]
        trial = TrialFigures(
            version=cand.version,
            mode=cand.mode,
            verdict=found.action if services.settings.promote_min_lists else None,
            reason=found.reason,
            figures=found.figures,
        )
    watched = production.probations.get(name) if production is not None else None
    probation = None
    if watched is not None and services.loaded.choices.on_probation(name, watched[0].version) is not None:
        cand, read_now = watched
        assert cand.replaced is not None and cand.ended is not None  # a promotion's record
        probation = ProbationFigures(
            version=cand.version,
            replaced=cand.replaced,
            since=cand.ended,
            verdict=read_now.action,  # type: ignore[arg-type]
            reason=read_now.reason,
            figures=read_now.figures,
        )
    return OnlineResponse(
        name=name,
        bucket_s=BUCKET_S,
        candidate=CandidateInfo.of(services.loaded.choices.candidates.get(name)),
        series=series,
        totals={
            f"{v}/{var}": OnlineFigures.model_validate(f.as_json())
            for (v, var), s in sorted(every.items())
            if (f := figures(s)) is not None
        },
        segments={
            f"{v}/{var}": {
                group: OnlineFigures.model_validate(f.as_json())
                for group, s in sorted(groups.items())
                if (f := figures(s)) is not None
            }
            for (v, var), groups in sorted(by_segment(rows).items())
        },
        window_s=window_s,
        exposure={f"{v}/{var}": ExposureFigures.model_validate(e.as_json()) for (v, var), e in sorted(shown.items())},
        trial=trial,
        probation=probation,
    )


@router.get("/models/{name}/versions", response_model=VersionsResponse, responses=errors(404, 422))
async def list_versions(services: ServicesDep, name: ModelNamePath) -> VersionsResponse:
    """Every version of a model on disk, newest first: its state on this worker, whether it is pinned,
    when it was trained and its offline test figures."""
    folders = version_folders(services.settings.artifacts_dir / name)
    if not folders:
        raise UnknownModel(f"no versions of model {name!r} on disk", ["path", "name"])
    reg = services.loaded
    served = reg.models.get(name)
    pinned = reg.choices.pins.get(name)
    cand, hold = reg.choices.candidates.get(name), reg.choices.holdbacks.get(name)
    beside = reg.candidate_models.get(name)
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
        state: Literal["serving", "candidate", "holdback", "kept", "broken"] = "kept"
        if served is not None and served.version == folder.name:
            state = "serving"
        elif beside is not None and beside.role is not None and beside.version == folder.name:
            state = "holdback" if isinstance(beside.role, Holdback) else "candidate"
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
    return VersionsResponse(
        name=name, pinned=pinned, candidate=CandidateInfo.of(cand), holdback=CandidateInfo.of(hold), versions=out
    )
