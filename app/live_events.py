"""Events and histories, framework-free: POST /events checked and stored durably, with the steps a social
model's events add to their targets' timelines; GET /history, a user's artifact history and live events.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app import store_calls
from app.answering import store_or_503
from app.errors import EventConflict, InvalidEvents, InvalidQuery, UnknownUser
from app.loaded import Served
from app.schemas import EventIn
from app.store import Event, HistoryStore
from models.engine import Actions, Engine, ItemDisplay, UserHistories, optional_time, received_steps, unknown_field

# The id of the step an event adds to another user's timeline (Engine.received_step): the event's id behind
# this prefix, which client ids may therefore not take for such a model.
RECEIVED_ID = "<-"


def with_histories(served: Served, where: list[str | int], error: type[InvalidEvents | InvalidQuery]) -> UserHistories:
    """The served engine as one over user histories, else `error` at `where`."""
    if not isinstance(served.engine, UserHistories):
        raise error(f"model {served.name!r} keeps no user histories", where)
    return served.engine


@dataclass
class EventsOutcome:
    namespace: str
    results: list[dict[str, Any]]  # per event, in request order
    stored: int
    duplicates: int
    dropped_old: int
    rejected: int


def validate_events(
    engine: Engine[Any, Any, Any], events: Sequence[EventIn], *, skew_s: float, now: float | None = None
) -> tuple[list[tuple[int, Event]], list[dict[str, Any]]]:
    """The rules the schema cannot state: -> (valid events with their index, a rejection per late one).

    An action the model does not take is a client error: the request is refused whole (422 naming
    each). An event later than the clock plus `skew_s` is one bad data point: rejected alone.
    """
    wrong = []
    if isinstance(engine, Actions):
        wrong = [(n, problem) for n, e in enumerate(events) if (problem := engine.check_action(e.action))]
    if wrong:
        raise InvalidEvents(
            f"{len(wrong)} event(s) without an action this model takes; nothing was stored",
            details=[{"loc": ["body", "events", n, "action"], "type": "invalid_action", "msg": p} for n, p in wrong],
        )
    # Refused whatever the event: one that adds no step (a self-loop, a model without received steps) could
    # otherwise take the id that a later event's received step needs.
    reserved = [n for n, e in enumerate(events) if e.event_id.startswith(RECEIVED_ID)]
    if reserved:
        raise InvalidEvents(
            f"{len(reserved)} event id(s) starting with {RECEIVED_ID!r}, which the service keeps for the "
            "steps an event adds to its target's timeline; nothing was stored",
            details=[
                {
                    "loc": ["body", "events", n, "event_id"],
                    "type": "reserved_event_id",
                    "msg": f"must not start with {RECEIVED_ID!r}",
                }
                for n in reserved
            ],
        )
    latest = (now if now is not None else time.time()) + skew_s
    valid: list[tuple[int, Event]] = []
    rejected: list[dict[str, Any]] = []
    for n, e in enumerate(events):
        if e.timestamp > latest:
            rejected.append(
                {
                    "index": n,
                    "event_id": e.event_id,
                    "status": "rejected",
                    "unknown_item": False,
                    "errors": [
                        {
                            "loc": ["body", "events", n, "timestamp"],
                            "type": "in_the_future",
                            "msg": f"later than the server's clock plus {skew_s:g} s",
                        }
                    ],
                }
            )
        else:
            valid.append(
                (
                    n,
                    Event(
                        e.event_id, e.user_id, e.item_id, e.timestamp, e.action, recommendation_id=e.recommendation_id
                    ),
                )
            )
    return valid, rejected


async def post_events(
    served: Served, events: Sequence[EventIn], *, store: HistoryStore | None, skew_s: float
) -> EventsOutcome:
    """Check each event, store the valid ones durably, and say what happened to each."""
    engine = with_histories(served, ["body", "model"], InvalidEvents)
    st = store_or_503(store)
    valid, rejected = validate_events(served.engine, events, skew_s=skew_s)
    stored_events = [e for _, e in valid]
    # Received steps go in the same durable write as their events: both are stored or neither.
    received = []
    if isinstance(engine, Actions):
        received = [
            (n, e, Event(RECEIVED_ID + e.event_id, m[0], m[1], e.timestamp, m[2], received=True))
            for n, e in valid
            if (m := engine.received_step(e.user_id, e.item_id, e.action)) is not None
        ]
    written = stored_events + [m for _, _, m in received]
    outcomes_all = await store_calls.write(st.append, engine.namespace, written) if written else []
    outcomes = outcomes_all[: len(stored_events)]
    clash = {n for (n, _), o in zip(valid, outcomes, strict=True) if o == "conflict"}
    clash |= {n for (n, _, _), o in zip(received, outcomes_all[len(stored_events) :], strict=True) if o == "conflict"}
    conflicts = [(n, e) for n, e in valid if n in clash]  # an event and its received step are one conflict
    if conflicts:
        details = [
            {
                "loc": ["body", "events", n, "event_id"],
                "type": "event_conflict",
                "msg": f"event id {e.event_id!r} was stored before with another payload",
            }
            for n, e in conflicts
        ]
        raise EventConflict(
            f"{len(conflicts)} event id(s) already stored with another payload; nothing was stored", details=details
        )
    known = engine.known([e.item_id for e in stored_events])
    results = rejected + [
        {"index": n, "event_id": e.event_id, "status": o, "unknown_item": not k, "errors": []}
        for (n, e), o, k in zip(valid, outcomes, known, strict=True)
    ]
    results.sort(key=lambda r: r["index"])
    stored = sum(o == "stored" for o in outcomes)
    dropped = sum(o == "dropped_old" for o in outcomes)
    return EventsOutcome(
        engine.namespace,
        results,
        stored=stored,
        duplicates=len(outcomes) - stored - dropped,
        dropped_old=dropped,
        rejected=len(rejected),
    )


async def user_history(
    served: Served,
    user_id: str,
    *,
    store: HistoryStore | None,
    limit: int,
    fields: Sequence[str],
    steps: str = "all",
) -> list[dict[str, Any]]:
    """A user's newest `limit` steps, newest first: the artifact's history, then the live events
    stored since, each with the asked fields of its item. `steps`: "all", "own" (what the user did) or
    "received" (what others did to the user: the steps a social model adds to a target's timeline), so
    a user's own steps are never hidden behind many received ones."""
    engine = with_histories(served, ["query", "model"], InvalidQuery)
    display = served.engine if isinstance(served.engine, ItemDisplay) else None
    bad = unknown_field(fields, display.item_fields if display else [])
    if bad is not None:
        raise InvalidQuery(bad[1], ["query", "fields", bad[0]])
    st = store_or_503(store)
    live = (await store_calls.read(st.events, engine.namespace, [user_id], limit)).get(user_id, [])
    stored = engine.stored_timeline(user_id)
    if not stored and not live:
        raise UnknownUser(f"unknown user {user_id!r}", ["query", "user_id"])
    every = [(step, "artifact") for step in stored] + [(step, "live") for step in live]
    if steps != "all":  # the store reads up to `limit` of each kind, so either kind fills its page
        received = received_steps(served.engine)
        every = [s for s in every if received(s[0][2]) == (steps == "received")]
    newest = every[::-1][:limit]
    ids = [raw for (raw, _, _), _ in newest]
    known = engine.known(ids)
    described = display.describe(ids, list(dict.fromkeys(fields))) if display and fields else [None] * len(ids)
    return [
        {
            "item_id": raw,
            "timestamp": optional_time(t),
            "action": action,
            "source": source,
            "known": k,
            **({"fields": d} if d is not None else {}),
        }
        for ((raw, t, action), source), k, d in zip(newest, known, described, strict=True)
    ]
