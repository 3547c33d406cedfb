from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from app import serving
from app.deps import parse_body, services_of
from app.handlers import json_response
from app.routers.docs import body_doc, errors
from app.routers.lean import LeanRouter, closed_connection
from app.schemas import NextLocationResponse, StayStep
from models.features import from_times
from models.tasks.next_location import LocQuery, LocStep

router = LeanRouter(tags=["next-location"])


def to_step(s: StayStep) -> LocStep:
    if s.started_at is not None and s.finished_at is not None:
        start_min, weekday, duration = from_times(s.started_at, s.finished_at)
        return LocStep(s.location_id, start_min, weekday, duration)
    assert s.start_min is not None and s.weekday is not None and s.duration_min is not None
    return LocStep(s.location_id, s.start_min, s.weekday, s.duration_min)


@router.post(
    "/next-location",
    response_model=NextLocationResponse,
    openapi_extra=body_doc("NextLocationRequest"),
    responses=errors(404, 422, 503, 504),
)
async def next_location(request: Request) -> Response:
    """Top-K next locations with probabilities; the unknown class is `location_id: null`."""
    services = services_of(request)
    body = await parse_body(request, services.schemas.next_location)
    with services.registry.lease(body.model, "next_location", services.settings.default_model) as served:
        request.state.model = served.name
        queries = [LocQuery(q.user_id, [to_step(s) for s in q.history], q.k) for q in body.queries]
        results = await serving.answer(
            served,
            queries,
            store=services.store,
            timeout_s=services.settings.request_timeout_s,
            abandoned=closed_connection(request),
        )
        return json_response(
            {
                "model": served.name,
                "version": served.version,
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
