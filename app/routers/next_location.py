from __future__ import annotations

from fastapi import APIRouter, Request

from app.engine.locator import Locator, LocQuery, LocStep
from app.errors import LimitExceeded, ModelUnavailable, UnknownModel
from app.schemas import ErrorResponse, NextLocationRequest, NextLocationResponse, StayStep
from models.features import from_times

router = APIRouter(tags=["next-location"])


def _step(s: StayStep) -> LocStep:
    if s.started_at is not None and s.finished_at is not None:
        start_min, weekday, duration = from_times(s.started_at, s.finished_at)
        return LocStep(s.location_id, start_min, weekday, duration)
    assert s.start_min is not None and s.weekday is not None and s.duration_min is not None
    return LocStep(s.location_id, s.start_min, s.weekday, s.duration_min)


def pick_locator(request: Request, name: str | None) -> tuple[str, Locator]:
    reg = request.app.state.registry
    name = name or reg.default_locator
    if name is None:
        raise ModelUnavailable("no next-location model is loaded", ["body", "model"])
    loc = reg.locators.get(name)
    if loc is None:
        if name in reg.broken:
            raise ModelUnavailable(f"model {name!r} failed to load: {reg.broken[name]}", ["body", "model"])
        raise UnknownModel(f"unknown next-location model {name!r}; loaded: {sorted(reg.locators)}", ["body", "model"])
    return name, loc


@router.post(
    "/next-location",
    response_model=NextLocationResponse,
    responses={404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
)
async def next_location(body: NextLocationRequest, request: Request) -> NextLocationResponse:
    """Top-K next locations with probabilities; the unknown class is `location_id: null`."""
    settings = request.app.state.settings
    if len(body.queries) > settings.max_queries:
        raise LimitExceeded(f"at most {settings.max_queries} queries per request", ["body", "queries"])
    for n, q in enumerate(body.queries):
        if q.k > settings.max_k:
            raise LimitExceeded(f"k must be at most {settings.max_k}", ["body", "queries", n, "k"])
        if q.history and len(q.history) > settings.max_history:
            raise LimitExceeded(
                f"at most {settings.max_history} history events per query", ["body", "queries", n, "history"]
            )
    name, loc = pick_locator(request, body.model)
    request.state.model = name
    queries = [LocQuery(q.user_id, [_step(s) for s in q.history], q.k) for q in body.queries]
    batcher = request.app.state.registry.loc_batchers[name]
    results = await batcher.submit(loc.prepare(queries), settings.request_timeout_s)
    return NextLocationResponse.model_validate(
        {
            "model": name,
            "version": str(loc.art.manifest["version"]),
            "results": [
                {
                    "locations": [{"location_id": i, "probability": p} for i, p in r.locations],
                    "unknown_locations": r.unknown_locations,
                    "unknown_user": r.unknown_user,
                    "history_truncated": r.truncated,
                }
                for r in results
            ],
        }
    )
