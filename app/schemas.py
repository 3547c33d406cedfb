"""What every route shares (the strict base, bounded types, the error shape) and the bodies of the
routes that are not a task's; a task's own bodies sit with its route (app/routers/recommend.py,
app/routers/next_location.py), which gives the task table a `body(limits)` factory.

Request bodies have one set of bounds, the settings in force: `bounded(limits)` makes the app's
own subclasses of the request models with them, and those same classes validate bodies and write
the OpenAPI document, so what is documented is exactly what is accepted.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from fastapi import Path
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
    field_validator,
)
from pydantic.json_schema import WithJsonSchema

from app.bodies import token_budget
from app.limits import Limits
from models.engine import FIELD_NAME
from models.ids import encodable, trainable

if TYPE_CHECKING:
    from app.store import Candidate


def _utf8(s: str) -> str:
    # JSON can carry lone surrogates, which no store or response can encode.
    if not encodable(s):
        raise ValueError("not valid UTF-8 text (lone surrogate)")
    return s


RawId = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_utf8)]


def _trainable(s: str) -> str:
    if not trainable(s):
        raise ValueError("must not be blank: a training log cannot hold an id of only whitespace")
    return s


# An id an event stores: exported into the next training log, so one training would refuse never gets in.
StoredId = Annotated[RawId, AfterValidator(_trainable)]
# A model name in a path: an artifact folder's name, so at most a file name's 255 bytes (ASCII here), and
# never "." or ".." (artifact folders starting with a dot are not models).
ModelNamePath = Annotated[str, Path(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")]
UnixTime = Annotated[float, Field(ge=0, le=1e11, description="unix seconds")]
FieldName = Annotated[str, Field(min_length=1, max_length=64, pattern=FIELD_NAME)]


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _rfc3339(v: object) -> object:
    # pydantic alone would also take unix seconds ("0") and times without an offset, which the
    # document's date-time format (RFC 3339) does not allow: accept exactly what it states.
    if not isinstance(v, str) or not _RFC3339.match(v):
        raise ValueError("expected an RFC 3339 date-time with an offset, e.g. 2024-03-05T17:00:00+01:00")
    return v


# The time of day is read in the time's own offset: local wall-clock time is what the features need.
# Not strict past the pattern check: strict mode would refuse the (already checked) text as a datetime.
DateTime = Annotated[
    dt.datetime,
    Field(strict=False),
    BeforeValidator(_rfc3339),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


class Strict(BaseModel):
    """Request fields take exactly the JSON types the document states: no "5" for 5, no 1 for true."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("k", "start_min", "weekday", "duration_min", mode="before", check_fields=False)
    @classmethod
    def _integral(cls, v: object) -> object:
        # JSON Schema's integer includes 5.0, which strict validation would refuse.
        return int(v) if isinstance(v, float) and v.is_integer() else v


# --- /events ---------------------------------------------------------------------------------------


class EventIn(Strict):
    """One interaction. An event later than the server's clock plus SEQSERVE_EVENT_SKEW_S is rejected
    alone (status "rejected" in the response), the others stored."""

    event_id: RawId = Field(
        description=(
            "replaying an event_id already stored with the same payload is a no-op; ids starting with '<-' are the "
            "service's (422)"
        )
    )
    user_id: StoredId
    item_id: StoredId = Field(description="the item; for a social model, the target user")
    timestamp: UnixTime
    action: StoredId | None = Field(
        None,
        description=(
            "the action: required by a social model, one it lists that the user performed (not a '<-' form: the "
            "service adds that step to the target's timeline itself)"
        ),
    )


class EventsRequest(Strict):
    model: RawId | None = Field(None, description="events go to this model's data set (default model if absent)")
    # A request whose events do not all match EventIn, or carry actions the model does not take, is
    # refused whole (422 naming each bad one); the clock's rule rejects single events in the response.
    events: list[EventIn] = Field(min_length=1)


class ErrorDetail(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class EventResult(BaseModel):
    index: int
    event_id: str | None
    status: Literal["stored", "duplicate", "dropped_old", "rejected"] = Field(
        description=(
            "dropped_old: taken (a replay is a duplicate) but older than the newest SEQSERVE_LIVE_EVENTS events "
            "its user keeps, so it is not in the user's live history"
        )
    )
    unknown_item: bool = Field(False, description="stored, but the served model does not know the item yet")
    errors: list[ErrorDetail] = Field(default_factory=list)


class EventsResponse(BaseModel):
    model: str
    namespace: str
    stored: int
    duplicates: int
    dropped_old: int
    rejected: int
    results: list[EventResult]


# --- service ---------------------------------------------------------------------------------------


# --- /history --------------------------------------------------------------------------------------


class HistoryStep(BaseModel):
    item_id: str = Field(description="the item; for a social model, the other user")
    timestamp: float | None = Field(description="unix seconds; null where the data has no times")
    action: str | None
    source: Literal["artifact", "live"] = Field(
        description="from the trained artifact, or stored by POST /events since"
    )
    known: bool = Field(description="whether the model knows the item (an unknown one counts after the next training)")
    fields: dict[str, str | float | list[str]] | None = Field(None, description="present when fields were asked for")


class HistoryResponse(BaseModel):
    model: str
    user_id: str
    events: list[HistoryStep] = Field(description="newest first")


class CandidateRequest(Strict):
    version: str = Field(
        min_length=1, max_length=64, pattern=r"^\d{8}T\d{6}Z(-\d+)?$", description="a version folder's name"
    )
    mode: Literal["canary", "shadow"] = Field(
        description="canary: `share` of the users (sticky by user id) get its answers; shadow: it also scores "
        "the by-user queries off the response path, its answers never returned"
    )
    share: float | None = Field(
        default=None, gt=0, le=1, description="canary: the share of users it answers (default SEQSERVE_CANARY_SHARE)"
    )


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


class CandidateInfo(BaseModel):
    version: str
    mode: Literal["canary", "shadow"]
    share: float
    since: float = Field(description="unix seconds it became the candidate")

    @classmethod
    def of(cls, c: Candidate | None) -> CandidateInfo | None:
        return None if c is None else cls(version=c.version, mode=c.mode, share=c.share, since=c.since)


class TrialMove(BaseModel):
    name: str
    action: Literal["started", "promoted", "retired"]
    candidate: CandidateInfo | None = Field(description="the candidate after the call")
    pinned: str | None
    reason: str
    reload: ReloadReport


class OnlineResponse(BaseModel):
    name: str
    bucket_s: float = Field(description="the width of each point's time bucket")
    candidate: CandidateInfo | None
    series: dict[str, list[tuple[float, int, float]]] = Field(
        description="'version/variant' -> [bucket start, scored lists, NDCG@10 of the bucket], oldest first"
    )
    totals: dict[str, OnlineFigures] = Field(description="'version/variant' -> figures over every bucket kept")


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
    candidate: CandidateInfo | None = Field(default=None, description="the version tried beside this one")
    online: dict[str, OnlineFigures] = Field(
        default_factory=dict,
        description="'version/variant' -> online figures of the live version and a candidate; variants: live, "
        "canary (the fair comparison: its users saw its lists), shadow (its lists were never shown: biased "
        "toward the live version, whose list the user acted on)",
    )


class ModelsResponse(BaseModel):
    defaults: dict[str, str | None] = Field(
        description="endpoint path -> the model a request to it gets when it names none"
    )
    models: list[ModelInfo]
    broken: dict[str, str]


class Readiness(BaseModel):
    ready: bool
    models: list[str]
    broken: dict[str, str] = Field(description="artifact name/version -> why it did not load")
    degraded: dict[str, str] = Field(default_factory=dict, description="model -> why its batcher is not healthy")
    history_store: str = Field(description="'<kind>: ok', or '<kind>: unavailable'")


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


class PinRequest(Strict):
    version: str = Field(
        min_length=1, max_length=64, pattern=r"^\d{8}T\d{6}Z(-\d+)?$", description="a version folder's name"
    )


class VersionMove(BaseModel):
    name: str
    pinned: str | None = Field(description="the version pinned now; null: the newest that loads")
    serving: str | None = Field(description="the version this worker serves after the move")
    reload: ReloadReport


class VersionInfo(BaseModel):
    version: str
    created_at: str | None
    state: Literal["serving", "candidate", "kept", "broken"] = Field(
        description="serving: answers requests here; candidate: tried beside it (canary or shadow); "
        "kept: on disk, not serving; broken: failed to load"
    )
    pinned: bool
    metrics: dict[str, Any] = Field(description="the offline test figures of its training run")
    reason: str | None = Field(default=None, description="why it is broken")


class VersionsResponse(BaseModel):
    name: str
    pinned: str | None
    candidate: CandidateInfo | None = None
    versions: list[VersionInfo] = Field(description="newest first")


class ErrorBody(BaseModel):
    code: str
    message: str
    details: list[ErrorDetail]


class ErrorResponse(BaseModel):
    error: ErrorBody


# --- the app's own bounded request models --------------------------------------------------------


@dataclass(frozen=True)
class Body:
    """A request body model with the app's bounds, and the most items each of its list fields can
    hold over a whole request (for bodies.token_budget)."""

    model: type[BaseModel]
    counts: dict[str, int]


@dataclass(frozen=True)
class RequestModels:
    requests: dict[str, Body]  # route name (models.tasks.Route) -> its body
    events: type[EventsRequest]
    limits: Limits = Limits()

    def budget(self, model: type[BaseModel]) -> int:
        """The most JSON values (',' + '{' + '[') a body of `model` within the limits can hold."""
        if model is self.events:
            return token_budget(model, {"events": self.limits.max_events})
        # A body without list fields of its own (an admin call's) is bounded by its fields alone.
        counts = next((b.counts for b in self.requests.values() if b.model is model), {})
        return token_budget(model, counts)


def queries_body(
    limits: Limits, request: type[Strict], query: type[Strict], counts: dict[str, int], **query_fields: Any
) -> Body:
    """A task's request body with `limits` as its bounds: `query` with its bounded `query_fields`, in a
    `request` of 1..max_queries of them (`counts`: the most items each list field can hold)."""
    bounded_query = create_model(query.__name__, __base__=query, **query_fields)
    model = create_model(
        request.__name__,
        __base__=request,
        queries=(list[bounded_query], Field(min_length=1, max_length=limits.max_queries)),  # type: ignore[valid-type]
    )
    model.limits = limits  # type: ignore[attr-defined]
    return Body(model, {"queries": limits.max_queries, **counts})


def bounded(limits: Limits, requests: dict[str, Body] | None = None) -> RequestModels:
    """The events body with `limits` as its bounds, beside the routes' `requests` bodies."""
    events = create_model(
        "EventsRequest",
        __base__=EventsRequest,
        events=(list[EventIn], Field(min_length=1, max_length=limits.max_events)),
    )
    return RequestModels(dict(requests or {}), cast(type[EventsRequest], events), limits)


def components(models: RequestModels) -> dict[str, Any]:
    """The OpenAPI component schemas of the request bodies the app parses itself, with its bounds."""
    out: dict[str, Any] = {}
    parsed: list[type[BaseModel]] = [
        *(b.model for b in models.requests.values()),
        models.events,
        PinRequest,
        CandidateRequest,
    ]
    for model in parsed:
        spec = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(spec.pop("$defs", {}))
        out[model.__name__] = spec
    return out
