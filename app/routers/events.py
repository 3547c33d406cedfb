from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import TypeAdapter, ValidationError

from app.errors import InvalidEvents, LimitExceeded
from app.routers.common import history_store, pick
from app.schemas import ErrorResponse, EventIn, EventResult, EventsRequest, EventsResponse, RawId
from app.store import Event
from models.ids import N_SPECIAL

router = APIRouter(tags=["events"])
_event = TypeAdapter(EventIn)
_raw_id: TypeAdapter[str] = TypeAdapter(RawId)


@router.post(
    "/events",
    response_model=EventsResponse,
    responses={404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
)
async def post_events(body: EventsRequest, request: Request) -> EventsResponse:
    """Append interactions to users' histories; answered only once they are durably stored.

    Each event is checked on its own: invalid ones are rejected with reasons, the others stored.
    A replayed event_id is a no-op ("duplicate"). Items the model does not know are stored and
    flagged: they count after the next training run.
    """
    settings = request.app.state.settings
    if len(body.events) > settings.max_events:
        raise LimitExceeded(f"at most {settings.max_events} events per request", ["body", "events"])
    reg = request.app.state.registry
    name, rec = pick(reg.recommenders, reg.broken, body.model, reg.default, "recommendation")
    request.state.model = name
    store = history_store(request)
    results: list[EventResult] = []
    valid: list[tuple[int, EventIn]] = []
    for n, raw in enumerate(body.events):
        try:
            valid.append((n, _event.validate_python(raw)))
        except ValidationError as exc:
            errors = [
                {"loc": ["body", "events", n, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()
            ]
            results.append(EventResult.model_validate(
                {"index": n, "event_id": _id_of(raw), "status": "rejected", "errors": errors}))
    if not valid:
        details = [e.model_dump() for r in results for e in r.errors]
        raise InvalidEvents(f"all {len(results)} events were rejected; see details", details)
    events = [Event(e.event_id, e.user_id, e.item_id, e.timestamp) for _, e in valid]
    added = await asyncio.to_thread(store.append, rec.namespace, events)
    known = rec.art.items.indices([e.item_id for e in events])
    for (n, e), new, idx in zip(valid, added, known, strict=True):
        results.append(EventResult(index=n, event_id=e.event_id, status="stored" if new else "duplicate",
                                   unknown_item=idx < N_SPECIAL, errors=[]))
    results.sort(key=lambda r: r.index)
    return EventsResponse(
        model=name, namespace=rec.namespace, stored=sum(added), duplicates=len(added) - sum(added),
        rejected=len(body.events) - len(valid), results=results,
    )


def _id_of(raw: Any) -> str | None:
    """The event's id when it is a valid one (the same check as EventIn's), else None."""
    try:
        return _raw_id.validate_python(raw.get("event_id") if isinstance(raw, dict) else None)
    except ValidationError:
        return None
