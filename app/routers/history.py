"""GET /history: a user's steps as the model sees them, newest first, with their items' fields."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from app import live_events
from app.deps import HistoryReaderKey, ServicesDep
from app.errors import ModelUnavailable
from app.handlers import json_response
from app.routers.docs import errors
from app.schemas import FieldName, RawId
from models.engine import MAX_FIELDS

# The bodies of these routes (app/schemas.py keeps what several routes share).


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


router = APIRouter(tags=["events"])
MAX_STEPS = 1000


@router.get(
    "/history",
    response_model=HistoryResponse,
    responses=errors(401, 403, 404, 422, 503),
    dependencies=[HistoryReaderKey],
)
async def get_history(
    services: ServicesDep,
    request: Request,
    user_id: Annotated[RawId, Query()],
    model: Annotated[RawId | None, Query(description="default: the /recommend default")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_STEPS)] = 50,
    fields: Annotated[list[FieldName] | None, Query(max_length=MAX_FIELDS, description="item fields to add")] = None,
    steps: Annotated[
        Literal["all", "own", "received"],
        Query(description="own: what the user did; received: what others did to the user (a social model)"),
    ] = "all",
) -> Response:
    """A user's newest steps: the trained artifact's history and the events stored since. Reads what
    POST /events writes, so it needs X-API-Key (the events or the read key) when either is set."""
    if services.events_route is None:
        raise ModelUnavailable("no model served here keeps user histories", ["query", "model"])
    with services.loaded.lease(
        model, services.events_route, services.settings.default_model, loc=("query", "model")
    ) as served:
        request.state.model = served.name
        events = await live_events.user_history(
            served, user_id, store=services.histories, limit=limit, fields=fields or [], steps=steps
        )
        return json_response({"model": served.name, "user_id": user_id, "events": events})
