"""POST /next-location: top-K next places from recent staypoints (MHSA)."""

from __future__ import annotations

from app.routers.tasks import TaskRoute
from app.schemas import NextLocationRequest, NextLocationResponse, StayStep, next_location_body
from models.features import from_times
from models.tasks.next_location import LocQuery, LocResult, LocStep


def to_step(s: StayStep) -> LocStep:
    if s.started_at is not None and s.finished_at is not None:
        start_min, weekday, duration = from_times(s.started_at, s.finished_at)
        return LocStep(s.location_id, start_min, weekday, duration)
    assert s.start_min is not None and s.weekday is not None and s.duration_min is not None
    return LocStep(s.location_id, s.start_min, s.weekday, s.duration_min)


def queries(body: NextLocationRequest) -> list[LocQuery]:
    return [LocQuery(q.user_id, [to_step(s) for s in q.history], q.k) for q in body.queries]


def result_json(r: LocResult) -> dict[str, object]:
    return {
        "locations": [{"location_id": i, "probability": p} for i, p in r.locations],
        "unknown_locations": r.unknown_locations,
        "unknown_user": r.unknown_user,
        "history_truncated": r.truncated,
    }


ROUTE = TaskRoute(
    name="next_location",
    path="/next-location",
    tag="next-location",
    summary="Top-K next locations with probabilities; the unknown class is `location_id: null`.",
    body=next_location_body,
    response=NextLocationResponse,
    queries=queries,
    result=result_json,
)
