from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from app import live_events
from app.deps import EventsBody, ServicesDep, WriterKey
from app.errors import ModelUnavailable
from app.handlers import json_response
from app.routers.docs import body_doc, errors
from app.schemas import ErrorDetail

# The bodies of these routes (app/schemas.py keeps what several routes share).


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


router = APIRouter(tags=["events"])


@router.post(
    "/events",
    response_model=EventsResponse,
    openapi_extra=body_doc("EventsRequest"),
    responses=errors(401, 403, 404, 409, 422, 503),
    dependencies=[WriterKey],
)
async def post_events(body: EventsBody, services: ServicesDep, request: Request) -> Response:
    """Append interactions to users' histories; answered only once they are durably stored.

    Events that do not match the schema, or carry an action the model does not take, refuse the
    request whole (422 naming each). An event later than the clock plus the allowed skew is rejected
    alone, with its reason, and the others are stored. A replayed event (same id, same payload) is a
    no-op ("duplicate"); an id stored before with another payload is a 409 and nothing of the request
    is stored. Items the model does not know are stored and flagged: they count after the next
    training run. Needs X-API-Key when SEQSERVE_EVENTS_API_KEY is set.
    """
    if services.events_route is None:
        raise ModelUnavailable("no model served here takes events", ["body", "model"])
    with services.loaded.lease(body.model, services.events_route, services.settings.default_model) as served:
        request.state.model = served.name
        out = await live_events.post_events(
            served, body.events, store=services.histories, skew_s=services.settings.event_skew_s
        )
        return json_response(
            {
                "model": served.name,
                "namespace": out.namespace,
                "stored": out.stored,
                "duplicates": out.duplicates,
                "dropped_old": out.dropped_old,
                "rejected": out.rejected,
                "results": out.results,
            }
        )
