from __future__ import annotations

from fastapi import APIRouter, Request

from app.engine.locator import LocQuery, LocStep
from app.routers.common import enforce_limits, pick
from app.schemas import ErrorResponse, NextLocationRequest, NextLocationResponse, StayStep
from models.features import from_times

router = APIRouter(tags=["next-location"])


def _step(s: StayStep) -> LocStep:
    if s.started_at is not None and s.finished_at is not None:
        start_min, weekday, duration = from_times(s.started_at, s.finished_at)
        return LocStep(s.location_id, start_min, weekday, duration)
    assert s.start_min is not None and s.weekday is not None and s.duration_min is not None
    return LocStep(s.location_id, s.start_min, s.weekday, s.duration_min)


@router.post(
    "/next-location",
    response_model=NextLocationResponse,
    responses={404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
)
async def next_location(body: NextLocationRequest, request: Request) -> NextLocationResponse:
    """Top-K next locations with probabilities; the unknown class is `location_id: null`."""
    settings = request.app.state.settings
    enforce_limits(settings, body.queries)
    reg = request.app.state.registry
    name, loc = pick(reg.locators, reg.broken, body.model, reg.default_locator, "next-location")
    request.state.model = name
    queries = [LocQuery(q.user_id, [_step(s) for s in q.history], q.k) for q in body.queries]
    batcher = reg.loc_batchers[name]
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
