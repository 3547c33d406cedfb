"""Serving functions, framework-free: what a request does between its router and its model.

The routers map HTTP bodies to the engine's query types and the results back; everything in
between (live history, the engine's hooks, the batcher, event validation and storage) is here, the
same for every task through the engine protocol.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from app.engine.registry import Served
from app.errors import EventConflict, InvalidEvents, StoreUnavailable
from app.schemas import EventIn, RawId
from app.store import Event, HistoryStore
from models.serving import Engine, Timeline

R = TypeVar("R")
# A by-user read of at most this many users runs on the event loop (SQLite: one indexed query of a
# few hundred rows); larger ones go to a thread so they never stall other requests.
LOOP_READ_USERS = 8
_event = TypeAdapter(EventIn)
_raw_id: TypeAdapter[str] = TypeAdapter(RawId)


def _store_or_503(store: HistoryStore | None) -> HistoryStore:
    if store is None:
        raise StoreUnavailable("history store unavailable; retry shortly")
    return store


async def live_history(engine: Engine[Any, Any, Any], queries: Sequence[Any],
                       store: HistoryStore | None) -> Mapping[str, Timeline]:
    """The queried users' newest live events, as many as the engine can use."""
    users = engine.users(queries)
    if not users or engine.namespace is None:
        return {}
    st = _store_or_503(store)
    if st.local_reads and len(set(users)) <= LOOP_READ_USERS:
        return st.events(engine.namespace, users, engine.live_budget)
    return await asyncio.to_thread(st.events, engine.namespace, users, engine.live_budget)


async def answer(served: Served, queries: Sequence[Any], *, store: HistoryStore | None,
                 timeout_s: float) -> list[Any]:
    """Live history -> prepare -> the model's batch queue -> results, in query order."""
    live = await live_history(served.engine, queries, store)
    prepared = served.engine.prepare(queries, live)
    return await served.batcher.submit(prepared, timeout_s)


@dataclass
class EventsOutcome:
    namespace: str
    results: list[dict[str, Any]]  # per event, in request order
    stored: int
    duplicates: int
    rejected: int


def _errors(exc: ValidationError, n: int) -> list[dict[str, Any]]:
    return [{"loc": ["body", "events", n, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]


def _id_of(raw: Any) -> str | None:
    """The event's id when it is a valid one (the same check as EventIn's), else None."""
    try:
        return _raw_id.validate_python(raw.get("event_id") if isinstance(raw, dict) else None)
    except ValidationError:
        return None


def validate_events(engine: Engine[Any, Any, Any], raw_events: Sequence[Any], *, skew_s: float,
                    now: float | None = None) -> tuple[list[tuple[int, Event]], list[dict[str, Any]]]:
    """Each event checked on its own: -> (valid ones with their index, a rejection per invalid one)."""
    latest = (now if now is not None else time.time()) + skew_s
    valid: list[tuple[int, Event]] = []
    rejected: list[dict[str, Any]] = []
    for n, raw in enumerate(raw_events):
        errors: list[dict[str, Any]] = []
        try:
            e = _event.validate_python(raw)
        except ValidationError as exc:
            errors = _errors(exc, n)
        else:
            if e.timestamp > latest:
                errors.append({"loc": ["body", "events", n, "timestamp"], "type": "in_the_future",
                               "msg": f"later than the server's clock plus {skew_s:g} s"})
            problem = engine.check_action(e.action)
            if problem:
                errors.append({"loc": ["body", "events", n, "action"], "type": "invalid_action", "msg": problem})
            if not errors:
                valid.append((n, Event(e.event_id, e.user_id, e.item_id, e.timestamp, e.action)))
        if errors:
            rejected.append({"index": n, "event_id": _id_of(raw), "status": "rejected", "unknown_item": False,
                             "errors": errors})
    return valid, rejected


async def post_events(served: Served, raw_events: Sequence[Any], *, store: HistoryStore | None,
                      skew_s: float) -> EventsOutcome:
    """Validate each event, store the valid ones durably, and say what happened to each."""
    engine = served.engine
    if engine.namespace is None:
        raise InvalidEvents(f"model {served.name!r} keeps no user histories", ["body", "model"])
    st = _store_or_503(store)
    valid, rejected = validate_events(engine, raw_events, skew_s=skew_s)
    if not valid:
        details = [e for r in rejected for e in r["errors"]]
        raise InvalidEvents(f"all {len(rejected)} events were rejected; see details", details=details)
    events = [e for _, e in valid]
    outcomes = await asyncio.to_thread(st.append, engine.namespace, events)
    conflicts = [(n, e) for (n, e), o in zip(valid, outcomes, strict=True) if o == "conflict"]
    if conflicts:
        details = [{"loc": ["body", "events", n, "event_id"], "type": "event_conflict",
                    "msg": f"event id {e.event_id!r} was stored before with another payload"} for n, e in conflicts]
        raise EventConflict(f"{len(conflicts)} event id(s) already stored with another payload; nothing was stored",
                            details=details)
    known = engine.known([e.item_id for e in events])
    results = rejected + [
        {"index": n, "event_id": e.event_id, "status": o, "unknown_item": not k, "errors": []}
        for (n, e), o, k in zip(valid, outcomes, known, strict=True)
    ]
    results.sort(key=lambda r: r["index"])
    stored = sum(o == "stored" for o in outcomes)
    return EventsOutcome(engine.namespace, results, stored, len(outcomes) - stored, len(rejected))


def finite(x: float) -> float | None:
    """JSON has no infinities."""
    return x if math.isfinite(x) else None
