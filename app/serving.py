"""Serving functions, framework-free: what a request does between its router and its model.

The routers map HTTP bodies to the engine's query types and the results back; everything in
between (live history, the engine's hooks, the batcher, event validation and storage) is here, the
same for every task through the engine protocol.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from app.batcher import AbandonedError
from app.errors import EventConflict, InvalidEvents, InvalidQuery, StoreUnavailable, UnknownUser
from app.loaded import Served, held
from app.online import CUT, ServedLists, in_canary
from app.schemas import EventIn
from app.store import Event, HistoryStore
from models.engine import (
    Actions,
    Engine,
    ItemDisplay,
    RecentActivity,
    RecentEvent,
    Timeline,
    UserHistories,
    optional_time,
    unknown_field,
)
from models.social import is_incoming

R = TypeVar("R")
log = logging.getLogger(__name__)
# A by-user read of at most this many users runs on the event loop (SQLite: one indexed query of a
# few hundred rows); larger ones go to a thread so they never stall other requests.
LOOP_READ_USERS = 8
# Requests of more queries than this are prepared off the loop, where the GIL changes hands every
# few milliseconds; smaller ones (the request path's) on the loop, without a thread hop.
PREPARE_INLINE_QUERIES = 64
# The work of large requests (parsing a large body, preparing many queries) runs here, one at a time:
# each step holds the GIL for tens of milliseconds in C (orjson), and two threads at once made the loop
# wait for both in a row (126 ms against 46 ms alone; docs/decisions/request-path-trims.md).
_LARGE_WORK = ThreadPoolExecutor(max_workers=1, thread_name_prefix="large-request")


async def off_loop(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """`fn(*args, **kwargs)` in the one thread for large requests' work."""
    return await asyncio.get_running_loop().run_in_executor(_LARGE_WORK, partial(fn, *args, **kwargs))


# The id of the step an event adds to another user's timeline (Engine.received_step): the event's id behind
# this prefix, which client ids may therefore not take for such a model.
RECEIVED_ID = "<-"


def _store_or_503(store: HistoryStore | None) -> HistoryStore:
    if store is None:
        raise StoreUnavailable("history store unavailable; retry shortly")
    return store


async def live_history(
    engine: Engine[Any, Any, Any], queries: Sequence[Any], store: HistoryStore | None
) -> Mapping[str, Timeline]:
    """The queried users' newest live events, as many as the engine can use."""
    if not isinstance(engine, UserHistories):
        return {}
    users = engine.users(queries)
    if not users:
        return {}
    st = _store_or_503(store)
    if st.local_reads and len(set(users)) <= LOOP_READ_USERS:
        return st.events(engine.namespace, users, engine.live_budget)
    return await asyncio.to_thread(st.events, engine.namespace, users, engine.live_budget)


async def add_recent(engine: Engine[Any, Any, Any], prepared: list[Any], store: HistoryStore | None) -> None:
    """Every user's live events of the span the prepared queries need (recent activity), counted in."""
    if not isinstance(engine, RecentActivity):
        return
    span = engine.recent_span(prepared)
    if span is None:
        return
    events: list[RecentEvent] = []
    if isinstance(engine, UserHistories):
        st = _store_or_503(store)
        events = await asyncio.to_thread(partial(st.recent, engine.namespace, start=span[0], end=span[1]))
    if len(prepared) <= PREPARE_INLINE_QUERIES:
        engine.add_recent(prepared, events)
    else:
        await off_loop(engine.add_recent, prepared, events)


async def answer(
    served: Served,
    queries: Sequence[Any],
    *,
    store: HistoryStore | None,
    timeout_s: float,
    abandoned: Callable[[], bool] | None = None,
) -> list[Any]:
    """Live history -> prepare -> the model's batch queue -> results, in query order. `abandoned`: true
    once the client has gone; the batcher then drops the request instead of running it."""
    live = await live_history(served.engine, queries, store)
    if len(queries) <= PREPARE_INLINE_QUERIES:
        prepared = served.engine.prepare(queries, live)
    else:  # ids to indices for a thousand queries is a hundred milliseconds of Python: not on the loop
        if abandoned is not None and abandoned():
            raise AbandonedError("the client went away before its request was prepared")
        prepared = await off_loop(served.engine.prepare, queries, live)
    await add_recent(served.engine, prepared, store)
    return await served.batcher.submit(prepared, timeout_s, abandoned=abandoned)


@dataclass
class ShadowWork:
    """Shadow candidates' answers, run after the live answer is ready and never awaited by a request.
    Shed first: while `max_in_flight` are running, or while the live model has requests waiting, a
    shadow query batch is dropped and counted in `shed` (model name -> count)."""

    max_in_flight: int
    running: int = 0
    shed: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def offer(
        self,
        live: Served,
        trial: Served,
        queries: Sequence[Any],
        *,
        store: HistoryStore | None,
        timeout_s: float,
        lists: ServedLists | None,
    ) -> None:
        if self.running >= self.max_in_flight or live.batcher.depth > 0 or trial.batcher.depth > 0:
            self.shed[live.name] = self.shed.get(live.name, 0) + 1
            return
        self.running += 1
        task = asyncio.get_running_loop().create_task(
            self._run(trial, queries, store=store, timeout_s=timeout_s, lists=lists)
        )
        self._tasks.add(task)  # a reference, so the task is not collected while it runs
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self,
        trial: Served,
        queries: Sequence[Any],
        *,
        store: HistoryStore | None,
        timeout_s: float,
        lists: ServedLists | None,
    ) -> None:
        try:
            with held(trial):
                results = await answer(trial, queries, store=store, timeout_s=timeout_s)
            if lists is not None:
                since = trial.candidate.since if trial.candidate is not None else None
                record(lists, trial, queries, results, variant="shadow", now=time.time(), trial=since)
        except Exception as exc:  # a shadow's failure is its own: counted, never seen by a client
            self.failed[trial.name] = self.failed.get(trial.name, 0) + 1
            log.debug("shadow %s/%s failed: %s", trial.name, trial.version, exc)
        finally:
            self.running -= 1

    def take(self) -> tuple[dict[str, int], dict[str, int]]:
        """(shed, failed) counts per model since the last take."""
        out = (self.shed, self.failed)
        self.shed, self.failed = {}, {}
        return out

    async def drain(self) -> None:
        """Wait for the shadow work in flight (at shutdown, before the batchers stop)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def record(
    lists: ServedLists,
    served: Served,
    queries: Sequence[Any],
    results: Sequence[Any],
    *,
    variant: str,
    now: float,
    trial: float | None = None,
) -> None:
    """Keep what each by-user query was served, to score it against the user's next event; `trial`: the
    start of the trial running for this model, whose figures are also kept per user."""
    engine = served.engine
    if not isinstance(engine, UserHistories):
        return
    namespace = engine.namespace
    for q, r in zip(queries, results, strict=True):
        user = engine.subject(q)
        if user is not None:
            # Only the top CUT: what the figures score; a list of k = 1000 held whole was 8-11 KB a user.
            top = tuple(engine.ranked(r))[:CUT]
            lists.record(namespace, user, (served.name, served.version, variant, top, now, trial))


async def answer_with_trial(
    served: Served,
    trial: Served | None,
    queries: Sequence[Any],
    *,
    store: HistoryStore | None,
    timeout_s: float,
    abandoned: Callable[[], bool] | None = None,
    lists: ServedLists | None = None,
    shadows: ShadowWork | None = None,
) -> tuple[list[Any], list[str]]:
    """The live answer (a canary's, for the queries by users in its share), each result with the
    version that gave it; the by-user answers are kept in `lists`, and a shadow candidate is offered
    the by-user queries once the live answer is ready."""
    if trial is not None and (trial.candidate is None or trial.version == served.version):
        trial = None  # promoted a moment ago: the trial is dropped once this reload ends
    canary = trial is not None and trial.candidate is not None and trial.candidate.mode == "canary"
    picks = [False] * len(queries)
    if canary:
        assert trial is not None and trial.candidate is not None
        share = trial.candidate.share
        picks = [(u := subject(served, q)) is not None and in_canary(served.name, u, share) for q in queries]
    # (entry, its queries, their results, variant): the live version alone, or it and the canary
    parts: list[tuple[Served, Sequence[Any], Sequence[Any], str]]
    if not any(picks):
        results = await answer(served, queries, store=store, timeout_s=timeout_s, abandoned=abandoned)
        versions = [served.version] * len(results)
        parts = [(served, queries, results, "live")]
    else:
        assert trial is not None
        live_q = [q for q, p in zip(queries, picks, strict=True) if not p]
        trial_q = [q for q, p in zip(queries, picks, strict=True) if p]
        live_r, trial_r = await asyncio.gather(
            answer(served, live_q, store=store, timeout_s=timeout_s, abandoned=abandoned) if live_q else _none(),
            answer(trial, trial_q, store=store, timeout_s=timeout_s, abandoned=abandoned),
        )
        live_it, trial_it = iter(live_r), iter(trial_r)
        results = [next(trial_it) if p else next(live_it) for p in picks]
        versions = [trial.version if p else served.version for p in picks]
        parts = [(served, live_q, live_r, "live"), (trial, trial_q, trial_r, "canary")]
    if lists is not None:
        now = time.time()
        since = trial.candidate.since if trial is not None and trial.candidate is not None else None
        for entry, qs, rs, variant in parts:
            record(lists, entry, qs, rs, variant=variant, now=now, trial=since)
    if trial is not None and not canary and shadows is not None:
        by_user = [q for q in queries if subject(served, q) is not None]
        if by_user:
            shadows.offer(served, trial, by_user, store=store, timeout_s=timeout_s, lists=lists)
    return results, versions


def subject(served: Served, query: Any) -> str | None:
    """The stored user a query asks about, for an engine over user histories; else None."""
    engine = served.engine
    return engine.subject(query) if isinstance(engine, UserHistories) else None


def with_histories(served: Served, where: list[str | int], error: type[InvalidEvents | InvalidQuery]) -> UserHistories:
    """The served engine as one over user histories, else `error` at `where`."""
    if not isinstance(served.engine, UserHistories):
        raise error(f"model {served.name!r} keeps no user histories", where)
    return served.engine


async def _none() -> list[Any]:
    return []


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
            valid.append((n, Event(e.event_id, e.user_id, e.item_id, e.timestamp, e.action)))
    return valid, rejected


async def post_events(
    served: Served, events: Sequence[EventIn], *, store: HistoryStore | None, skew_s: float
) -> EventsOutcome:
    """Check each event, store the valid ones durably, and say what happened to each."""
    engine = with_histories(served, ["body", "model"], InvalidEvents)
    st = _store_or_503(store)
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
    outcomes_all = await asyncio.to_thread(st.append, engine.namespace, written) if written else []
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
    st = _store_or_503(store)
    live = (await asyncio.to_thread(st.events, engine.namespace, [user_id], limit)).get(user_id, [])
    stored = engine.stored_timeline(user_id)
    if not stored and not live:
        raise UnknownUser(f"unknown user {user_id!r}", ["query", "user_id"])
    every = [(step, "artifact") for step in stored] + [(step, "live") for step in live]
    if steps != "all":  # the store reads up to `limit` of each kind, so either kind fills its page
        every = [s for s in every if is_incoming(s[0][2]) == (steps == "received")]
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
