"""Every request and response body of the API, with bounds on every field."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator


def _utf8(s: str) -> str:
    # Bodies checked after JSON parsing (the events) can hold lone surrogates, which no store or
    # response can encode.
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid UTF-8 text (lone surrogate)") from None
    return s


RawId = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_utf8)]
UnixTime = Annotated[float, Field(ge=0, le=1e11, description="unix seconds")]
MAX_HISTORY = 10_000


def _utc_if_naive(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


# Local wall-clock time is what the features need; a naive time is read as given.
AwareOrNaive = Annotated[dt.datetime, AfterValidator(_utc_if_naive)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HistoryEvent(Strict):
    item_id: RawId
    timestamp: UnixTime | None = None


class RecommendQuery(Strict):
    user_id: RawId | None = None
    history: list[HistoryEvent] | None = Field(None, max_length=MAX_HISTORY)
    k: int = Field(10, ge=1, le=10_000)
    exclude_seen: bool = True
    exclude_future: bool = True
    exclude_items: list[RawId] = Field(default_factory=list, max_length=MAX_HISTORY)
    as_of: UnixTime | None = None

    @model_validator(mode="after")
    def _user_or_history(self) -> RecommendQuery:
        if self.user_id is None and not self.history:
            raise ValueError("give a user_id, a non-empty history, or both")
        return self


class RecommendRequest(Strict):
    model: RawId | None = None
    queries: list[RecommendQuery] = Field(min_length=1, max_length=100_000)


class ScoredItem(BaseModel):
    item_id: str
    score: float


class Excluded(BaseModel):
    seen: int
    future: int
    requested: int


class RecommendResult(BaseModel):
    user_id: str | None
    items: list[ScoredItem]
    unknown_items: list[str]
    excluded: Excluded
    history_truncated: bool = Field(description="longer than the model reads: its most recent part was used")


class RecommendResponse(BaseModel):
    model: str
    version: str
    results: list[RecommendResult]


class StayStep(Strict):
    """One staypoint: its place and either start minute/weekday/duration or ISO 8601 start/end."""

    location_id: RawId
    start_min: int | None = Field(None, ge=0, le=1439, description="minute of the day")
    weekday: int | None = Field(None, ge=0, le=6, description="0 = Monday")
    duration_min: int | None = Field(None, ge=0, le=10_000_000)
    started_at: AwareOrNaive | None = None
    finished_at: AwareOrNaive | None = None

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
    history: list[StayStep] = Field(min_length=1, max_length=MAX_HISTORY)
    k: int = Field(5, ge=1, le=10_000)


class NextLocationRequest(Strict):
    model: RawId | None = None
    queries: list[NextLocationQuery] = Field(min_length=1, max_length=100_000)


class ScoredLocation(BaseModel):
    location_id: str | None = Field(description="null = a place not seen in training")
    probability: float


class NextLocationResult(BaseModel):
    locations: list[ScoredLocation]
    unknown_locations: list[str]
    unknown_user: bool
    history_truncated: bool


class NextLocationResponse(BaseModel):
    model: str
    version: str
    results: list[NextLocationResult]


class ModelInfo(BaseModel):
    name: str
    kind: str
    task: str
    version: str
    created_at: str | None
    catalog_size: int
    device: str
    metrics: dict[str, object]


class ModelsResponse(BaseModel):
    default: str | None
    default_next_location: str | None
    models: list[ModelInfo]
    broken: dict[str, str]


class Readiness(BaseModel):
    ready: bool
    models: list[str]
    broken: dict[str, str]
    history_store: str = Field(description="'<kind>: ok', or why the store cannot be used")


class EventIn(Strict):
    """One interaction; validated one by one, so a bad event is rejected alone."""

    event_id: RawId = Field(description="replaying an event_id already stored is a no-op")
    user_id: RawId
    item_id: RawId
    timestamp: UnixTime


class EventsRequest(Strict):
    model: RawId | None = Field(None, description="events go to this model's data set (default model if absent)")
    # Plain objects here: each is checked against EventIn on its own (see the events router).
    events: list[Any] = Field(min_length=1, max_length=100_000)


class EventResult(BaseModel):
    index: int
    event_id: str | None
    status: Literal["stored", "duplicate", "rejected"]
    unknown_item: bool = Field(False, description="stored, but the served model does not know the item yet")
    errors: list[ErrorDetail] = Field(default_factory=list)


class EventsResponse(BaseModel):
    model: str
    namespace: str
    stored: int
    duplicates: int
    rejected: int
    results: list[EventResult]


class ReloadReport(BaseModel):
    loaded: dict[str, str] = Field(description="model name -> version swapped in")
    unchanged: dict[str, str]
    failed: dict[str, str] = Field(description="model name -> error; an older version keeps serving if one was")


class ErrorDetail(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    code: str
    message: str
    details: list[ErrorDetail]


class ErrorResponse(BaseModel):
    error: ErrorBody
