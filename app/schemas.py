"""Every request and response body of the API, with bounds on every field."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

RawId = Annotated[str, Field(min_length=1, max_length=256)]
UnixTime = Annotated[float, Field(ge=0, le=1e11, description="unix seconds")]
MAX_HISTORY = 10_000


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


class RecommendResponse(BaseModel):
    model: str
    version: str
    results: list[RecommendResult]


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
    models: list[ModelInfo]
    broken: dict[str, str]


class Readiness(BaseModel):
    ready: bool
    models: list[str]
    broken: dict[str, str]


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
