"""POST /next-location: top-K next places from recent staypoints (MHSA)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.limits import Limits
from app.routers.tasks import TaskRoute, register_route
from app.schemas import Body, DateTime, RawId, Strict, queries_body
from models.features import from_times
from models.tasks.next_location import LocQuery, LocResult, LocStep

# --- the request and response bodies ---------------------------------------------------------------


class StayStep(Strict):
    """One staypoint: its place and either start minute/weekday/duration or ISO 8601 start/end
    (finished_at not before started_at: a rule JSON Schema cannot state, answered with a 422)."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["start_min", "weekday", "duration_min"],
                    "properties": {
                        "start_min": {"type": "integer"},
                        "weekday": {"type": "integer"},
                        "duration_min": {"type": "integer"},
                        "started_at": {"type": "null"},
                        "finished_at": {"type": "null"},
                    },
                },
                {
                    "required": ["started_at", "finished_at"],
                    "properties": {
                        "started_at": {"type": "string"},
                        "finished_at": {"type": "string"},
                        "start_min": {"type": "null"},
                        "weekday": {"type": "null"},
                        "duration_min": {"type": "null"},
                    },
                },
            ]
        }
    )

    location_id: RawId
    start_min: int | None = Field(None, ge=0, le=1439, description="minute of the day")
    weekday: int | None = Field(None, ge=0, le=6, description="0 = Monday")
    duration_min: int | None = Field(None, ge=0, le=10_000_000)
    started_at: DateTime | None = None
    finished_at: DateTime | None = None

    @model_validator(mode="after")
    def _one_time_form(self) -> StayStep:
        relative = (self.start_min, self.weekday, self.duration_min)
        absolute = (self.started_at, self.finished_at)
        if all(v is not None for v in relative) and all(v is None for v in absolute):
            return self
        if all(v is not None for v in absolute) and all(v is None for v in relative):
            assert self.started_at is not None and self.finished_at is not None
            if self.finished_at < self.started_at:
                raise ValueError("finished_at is before started_at")
            return self
        raise ValueError("give start_min, weekday and duration_min, or started_at and finished_at")


class NextLocationQuery(Strict):
    user_id: RawId | None = None
    history: list[StayStep] = Field(min_length=1)
    k: int = Field(5, ge=1)


class NextLocationRequest(Strict):
    limits: ClassVar[Limits] = Limits()
    model: RawId | None = None
    queries: list[NextLocationQuery] = Field(min_length=1)

    @field_validator("queries")
    @classmethod
    def _totals(cls, queries: list[NextLocationQuery]) -> list[NextLocationQuery]:
        lim = cls.limits
        if sum(q.k for q in queries) > lim.max_total_k:
            raise ValueError(f"the queries' k add up to more than {lim.max_total_k}")
        if sum(len(q.history) for q in queries) > lim.max_total_items:
            raise ValueError(f"history steps add up to more than {lim.max_total_items}")
        return queries


class ScoredLocation(BaseModel):
    location_id: str | None = Field(description="null = a place not seen in training")
    probability: float


class NextLocationResult(BaseModel):
    locations: list[ScoredLocation]
    unknown_locations: list[str]
    unknown_user: bool
    history_truncated: bool
    version: str | None = Field(
        default=None,
        description="the version that answered this query (a canary's for users in its share); only for a caller "
        "with a key (admin, events or read) where any is set, so nobody else learns which side a user is on",
    )


class NextLocationResponse(BaseModel):
    model: str
    version: str = Field(description="the live version of the model")
    results: list[NextLocationResult]


def next_location_body(limits: Limits) -> Body:
    """The /next-location body with `limits` as its bounds."""
    return queries_body(
        limits,
        NextLocationRequest,
        NextLocationQuery,
        {"history": limits.max_total_items},
        history=(list[StayStep], Field(min_length=1, max_length=limits.max_history)),
        k=(int, Field(5, ge=1, le=limits.max_k)),
    )


# --- from the body to the engine's queries, and back ------------------------------------------------


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


register_route(
    TaskRoute(
        name="next_location",
        path="/next-location",
        tag="next-location",
        summary="Top-K next locations with probabilities; the unknown class is `location_id: null`.",
        body=next_location_body,
        response=NextLocationResponse,
        queries=queries,
        result=result_json,
    )
)
