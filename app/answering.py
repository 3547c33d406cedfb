"""Answering, framework-free: what a request does between its router and its model.

The routers map HTTP bodies to the engine's query types and the results back; everything in between
(live history, the engine's hooks, the batcher) is here, the same for every task through the engine
protocol. A candidate beside the live version (canary, shadow, what was served): app/production/trials.py.
Events and histories (POST /events, GET /history): app/live_events.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from app import store_calls
from app.batcher import AbandonedError, BatchTimeoutError
from app.errors import StoreUnavailable
from app.loaded import Served
from app.store import HistoryStore
from models.engine import Engine, RecentActivity, UserHistories
from models.queries import RecentEvent, Timeline

R = TypeVar("R")
log = logging.getLogger(__name__)
# A by-user read of at most this many users runs on the event loop (SQLite: indexed queries of a few
# hundred rows), at most LOOP_READ_ROWS rows in all: users with more live events than their share are
# read again, whole, in a thread, so a few heavy users never hold the loop (docs/BENCHMARKS.md). Larger
# reads go to a thread from the start, so they never stall other requests.
LOOP_READ_USERS = 8
LOOP_READ_ROWS = 256
# Requests of more queries than this are prepared off the loop, where the GIL changes hands every
# few milliseconds; smaller ones (the request path's) on the loop, without a thread hop.
PREPARE_INLINE_QUERIES = 64
# The work of large requests (parsing a large body, preparing many queries) runs here, one at a time:
# each step holds the GIL for tens of milliseconds in C (orjson), and two threads at once made the loop
# wait for both in a row (docs/decisions/request-path-trims.md).
_LARGE_WORK = ThreadPoolExecutor(max_workers=1, thread_name_prefix="large-request")


async def off_loop(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """`fn(*args, **kwargs)` in the one thread for large requests' work."""
    return await asyncio.get_running_loop().run_in_executor(_LARGE_WORK, partial(fn, *args, **kwargs))


def store_or_503(store: HistoryStore | None) -> HistoryStore:
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
    st = store_or_503(store)
    budget, distinct = engine.live_budget, len(set(users))
    if not st.local_reads or distinct > LOOP_READ_USERS:
        return await store_calls.read(st.events, engine.namespace, users, budget)
    share = LOOP_READ_ROWS // distinct
    if budget <= share:
        return st.events(engine.namespace, users, budget)
    got = st.events(engine.namespace, users, share)
    more = [user for user, steps in got.items() if len(steps) >= share]  # may hold more than their share
    if more:
        got.update(await store_calls.read(st.events, engine.namespace, more, budget))
    return got


async def add_recent(engine: Engine[Any, Any, Any], prepared: list[Any], store: HistoryStore | None) -> None:
    """Every user's live events of the span the prepared queries need (recent activity), counted in."""
    if not isinstance(engine, RecentActivity):
        return
    span = engine.recent_span(prepared)
    if span is None:
        return
    events: list[RecentEvent] = []
    if isinstance(engine, UserHistories):
        st = store_or_503(store)
        events = await store_calls.read(st.recent, engine.namespace, start=span[0], end=span[1])
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
    once the client has gone; the batcher then drops the request instead of running it. `timeout_s` covers
    every step: what reading and preparing took is not given again to the model's queue."""
    start = time.monotonic()
    live = await live_history(served.engine, queries, store)
    if len(queries) <= PREPARE_INLINE_QUERIES:
        prepared = served.engine.prepare(queries, live)
    else:  # ids to indices for a thousand queries is a hundred milliseconds of Python: not on the loop
        if abandoned is not None and abandoned():
            raise AbandonedError("the client went away before its request was prepared")
        prepared = await off_loop(served.engine.prepare, queries, live)
    await add_recent(served.engine, prepared, store)
    left = timeout_s - (time.monotonic() - start)
    if left <= 0:
        raise BatchTimeoutError(f"no answer within {timeout_s:.3f}s")
    return await served.batcher.submit(prepared, left, abandoned=abandoned)


def subject(served: Served, query: Any) -> str | None:
    """The stored user a query asks about, for an engine over user histories; else None."""
    engine = served.engine
    return engine.subject(query) if isinstance(engine, UserHistories) else None
