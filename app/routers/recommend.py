"""POST /recommend: top-K next items (SASRec, BERT4Rec) or next users (the social model)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.limits import Limits
from app.routers.tasks import TaskRoute, register_route
from app.schemas import Body, FieldName, RawId, Strict, UnixTime, queries_body
from models.catalog import (
    MAX_FILTER_DEPTH,
    MAX_FILTER_NODES,
    MAX_FILTER_VALUES,
    MAX_PER_COUNT,
    MAX_PER_FIELDS,
    MAX_PER_POOL,
)
from models.engine import MAX_FIELDS
from models.tasks.recommend import RecQuery, RecResult

# --- the request and response bodies ---------------------------------------------------------------


class HistoryEvent(Strict):
    item_id: RawId = Field(description="the item; for a social model, the target user")
    timestamp: UnixTime | None = None
    action: RawId | None = Field(
        None,
        description=(
            "the action: required by a social model, one of its actions (GET /models lists them; '<-a2q' is a step "
            "another user performed on this one); 422 otherwise"
        ),
    )


class RecommendQuery(Strict):
    # The rule the validator below enforces, stated in the document too.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["user_id"], "properties": {"user_id": {"type": "string"}}},
                {"required": ["history"], "properties": {"history": {"type": "array", "minItems": 1}}},
            ]
        }
    )

    user_id: RawId | None = None
    history: list[HistoryEvent] | None = None
    k: int = Field(10, ge=1)
    exclude_seen: bool | None = Field(None, description="default: true for item recommenders, false for social models")
    exclude_future: bool = True
    exclude_items: list[RawId] = Field(default_factory=list)
    as_of: UnixTime | None = None
    fields: list[FieldName] = Field(
        default_factory=list,
        max_length=MAX_FIELDS,
        description=(
            "item fields to return with each item, e.g. title and genres (GET /models lists a model's); "
            "none by default; an unknown one is a 422"
        ),
    )
    filter: dict[str, Any] | None = Field(
        None,
        description=(
            "a business rule over the item fields GET /models lists and item_id: a condition "
            '{"field": f, "any_of": [...]} (a list field: one of its values among them), '
            '{"field": f, "none_of": [...]}, '
            '{"field": f, "between": [low, high]} (numbers; null: open), composed with {"all": [...]}, {"any": [...]} '
            f'and {{"not": ...}}; at most {MAX_FILTER_NODES} conditions, {MAX_FILTER_VALUES} values, nested '
            f"{MAX_FILTER_DEPTH} deep; an unknown field or a value of the wrong type is a 422 naming it "
            "(docs/API.md)"
        ),
    )
    max_per: dict[FieldName, Annotated[int, Field(ge=1, le=MAX_PER_COUNT)]] | None = Field(
        None,
        max_length=MAX_PER_FIELDS,
        description=(
            'diversity within the list, e.g. {"genres": 3}: an item is kept when, for each of its values of the field, '
            f"fewer than that many better-scored candidates hold the value; {MAX_PER_POOL} times k candidates are "
            "ranked for it, so the list may come back shorter than k"
        ),
    )
    on_unknown: Literal["fallback", "error"] = Field(
        "fallback",
        description=(
            "a user_id the model does not know, with no live events and no history: 'fallback' answers with what "
            "users take now (else the catalog's most popular), its result's source says which; 'error' answers 404"
        ),
    )

    @model_validator(mode="after")
    def _user_or_history(self) -> RecommendQuery:
        if self.user_id is None and not self.history:
            raise ValueError("give a user_id, a non-empty history, or both")
        return self


class RecommendRequest(Strict):
    limits: ClassVar[Limits] = Limits()
    model: RawId | None = None
    queries: list[RecommendQuery] = Field(min_length=1)

    @field_validator("queries")
    @classmethod
    def _totals(cls, queries: list[RecommendQuery]) -> list[RecommendQuery]:
        lim = cls.limits
        if sum(q.k for q in queries) > lim.max_total_k:
            raise ValueError(f"the queries' k add up to more than {lim.max_total_k}")
        if sum(len(q.history or ()) + len(q.exclude_items) for q in queries) > lim.max_total_items:
            raise ValueError(f"history events and excluded items add up to more than {lim.max_total_items}")
        return queries


class ScoredItem(BaseModel):
    item_id: str
    score: float
    fields: dict[str, str | float | list[str]] | None = Field(
        None, description="present when the query asked for fields: the item's values (a missing value is left out)"
    )


class Excluded(BaseModel):
    seen: int
    future: int
    requested: int
    filtered: int = Field(0, description="taken out by the query's filter or because the item is hidden")


class RecommendResult(BaseModel):
    user_id: str | None
    source: Literal["model", "popular_recent", "popular"] = Field(
        "model",
        description="where the list came from: the model, or for a user it does not know what users took over "
        "the recent window (popular_recent) or the catalog's most popular (popular)",
    )
    items: list[ScoredItem]
    unknown_items: list[str]
    excluded: Excluded
    history_truncated: bool = Field(description="longer than the model reads: its most recent part was used")
    complete: bool = Field(
        True,
        description="false when fewer than k items were left (the exclusions, the filter or max_per took the rest)",
    )
    recommendation_id: str | None = Field(
        default=None,
        description="present on an answer by user_id: name it on the event the user took from this list "
        "(POST /events) and online evaluation scores exactly this list; unguessable, and good for this user only",
    )
    version: str | None = Field(
        default=None,
        description="the version that answered this query (a canary's for users in its share; an interleaved "
        "candidate's when the answer mixes it with the live version's); only for a caller with a key (admin, "
        "events or read) where any is set, so nobody else learns which side a user is on",
    )


class RecommendResponse(BaseModel):
    model: str
    version: str = Field(description="the live version of the model")
    results: list[RecommendResult]


def recommend_body(limits: Limits) -> Body:
    """The /recommend body with `limits` as its bounds (validation and docs)."""
    # History steps and excluded ids share MAX_TOTAL_ITEMS; a step holds more values than an id, so a
    # body of steps alone holds the most.
    return queries_body(
        limits,
        RecommendRequest,
        RecommendQuery,
        {"history": limits.max_total_items, "exclude_items": 0},
        history=(list[HistoryEvent] | None, Field(None, max_length=limits.max_history)),
        k=(int, Field(10, ge=1, le=limits.max_k)),
        exclude_items=(list[RawId], Field(default_factory=list, max_length=limits.max_exclude_items)),
    )


# --- from the body to the engine's queries, and back ------------------------------------------------


def to_query(q: RecommendQuery) -> RecQuery:
    return RecQuery(
        user_id=q.user_id,
        history=[(e.item_id, e.timestamp, e.action) for e in q.history or ()],
        k=q.k,
        exclude_seen=q.exclude_seen,
        exclude_future=q.exclude_future,
        exclude_items=q.exclude_items,
        as_of=q.as_of,
        fields=list(q.fields),  # as sent: an error's index is the request's (answers list each field once)
        filter=q.filter,
        max_per=q.max_per,
        on_unknown=q.on_unknown,
    )


def result_json(r: RecResult) -> dict[str, object]:
    items: list[dict[str, object]] = [{"item_id": i, "score": s} for i, s in r.items]
    if r.fields is not None:
        for item, values in zip(items, r.fields, strict=True):
            item["fields"] = values
    return {
        "user_id": r.user_id,
        "source": r.source,
        "items": items,
        "unknown_items": r.unknown_items,
        "excluded": r.excluded,
        "history_truncated": r.history_truncated,
        "complete": r.complete,
    }


def queries(body: RecommendRequest) -> list[RecQuery]:
    return [to_query(q) for q in body.queries]


register_route(
    TaskRoute(
        name="recommend",
        path="/recommend",
        tag="recommend",
        summary="Top-K next items (or, from a social model, next users) for each query, in one forward pass.",
        body=recommend_body,
        response=RecommendResponse,
        queries=queries,
        result=result_json,
        live_events=True,
    )
)
