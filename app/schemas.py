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
    from app.choices import Beside


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


# --- /events' request: the app bounds it (`bounded`) and app/live_events.py reads its events --------------


class EventIn(Strict):
    """One interaction. An event later than the server's clock plus SEQSERVE_EVENT_SKEW_S is rejected
    alone (status "rejected" in the response), the others stored."""

    event_id: StoredId = Field(
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
    recommendation_id: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]+$",
        description=(
            "the recommendation_id of the answer (POST /recommend) the user took this item from: online evaluation "
            "scores exactly that list; absent, or naming no list this user was given, the user's newest answer "
            "before the event is scored"
        ),
    )


class EventsRequest(Strict):
    model: RawId | None = Field(None, description="events go to this model's data set (default model if absent)")
    # A request whose events do not all match EventIn, or carry actions the model does not take, is
    # refused whole (422 naming each bad one); the clock's rule rejects single events in the response.
    events: list[EventIn] = Field(min_length=1)


# --- shared by several routes: the error shape, a candidate ------------------------------------------


class ErrorDetail(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


# A version beside the live one, as the API shows it: a trial's candidate, or a promotion's holdback (no
# docstring: it would become the schema's description in the OpenAPI document).
class CandidateInfo(BaseModel):
    version: str
    mode: Literal["canary", "shadow", "interleave", "holdback"]
    share: float
    since: float = Field(description="unix seconds it became the candidate")

    @classmethod
    def of(cls, c: Beside | None) -> CandidateInfo | None:
        return None if c is None else cls(version=c.version, mode=c.variant, share=c.share, since=c.since)


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


def components(models: RequestModels, *others: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI component schemas of the request bodies the app parses itself: the bounded ones and
    `others` (bodies a route keeps beside it)."""
    out: dict[str, Any] = {}
    parsed: list[type[BaseModel]] = [*(b.model for b in models.requests.values()), models.events, *others]
    for model in parsed:
        spec = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(spec.pop("$defs", {}))
        out[model.__name__] = spec
    return out
