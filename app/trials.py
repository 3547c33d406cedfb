"""A candidate on trial beside the live version, on the request path: a canary answers its share of the
users, a shadow is offered the by-user queries once the live answer is ready (never awaited by a
request), and what each side served by user is kept for online evaluation (app/online.py). A trial is a
candidate's run from its `since` (app/choices.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.loaded import Served, held
from app.online import CUT, ServedLists, in_canary
from app.serving import answer, subject
from app.store import HistoryStore
from models.engine import UserHistories

log = logging.getLogger(__name__)


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
        beside: Served,
        queries: Sequence[Any],
        *,
        store: HistoryStore | None,
        timeout_s: float,
        lists: ServedLists | None,
    ) -> None:
        if self.running >= self.max_in_flight or live.batcher.depth > 0 or beside.batcher.depth > 0:
            self.shed[live.name] = self.shed.get(live.name, 0) + 1
            return
        self.running += 1
        task = asyncio.get_running_loop().create_task(
            self._run(beside, queries, store=store, timeout_s=timeout_s, lists=lists)
        )
        self._tasks.add(task)  # a reference, so the task is not collected while it runs
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self,
        beside: Served,
        queries: Sequence[Any],
        *,
        store: HistoryStore | None,
        timeout_s: float,
        lists: ServedLists | None,
    ) -> None:
        try:
            with held(beside):
                results = await answer(beside, queries, store=store, timeout_s=timeout_s)
            if lists is not None:
                since = beside.candidate.since if beside.candidate is not None else None
                record(lists, beside, queries, results, variant="shadow", now=time.time(), trial_start=since)
        except Exception as exc:  # a shadow's failure is its own: counted, never seen by a client
            self.failed[beside.name] = self.failed.get(beside.name, 0) + 1
            log.debug("shadow %s/%s failed: %s", beside.name, beside.version, exc)
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
    trial_start: float | None = None,
) -> None:
    """Keep what each by-user query was served, to score it against the user's next event; `trial_start`:
    when the trial running for this model began (its candidate's `since`), whose figures are also kept per user."""
    engine = served.engine
    if not isinstance(engine, UserHistories):
        return
    namespace = engine.namespace
    for q, r in zip(queries, results, strict=True):
        user = engine.subject(q)
        if user is not None:
            # Only the top CUT: what the figures score; a list of k = 1000 held whole was 8-11 KB a user.
            top = tuple(engine.ranked(r))[:CUT]
            lists.record(namespace, user, (served.name, served.version, variant, top, now, trial_start))


async def answer_with_candidate(
    served: Served,
    beside: Served | None,
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
    if beside is not None and (beside.candidate is None or beside.version == served.version):
        beside = None  # promoted a moment ago: it is dropped once this reload ends
    canary = beside is not None and beside.candidate is not None and beside.candidate.mode == "canary"
    picks = [False] * len(queries)
    if canary:
        assert beside is not None and beside.candidate is not None
        share = beside.candidate.share
        picks = [(u := subject(served, q)) is not None and in_canary(served.name, u, share) for q in queries]
    # (entry, its queries, their results, variant): the live version alone, or it and the canary
    parts: list[tuple[Served, Sequence[Any], Sequence[Any], str]]
    if not any(picks):
        results = await answer(served, queries, store=store, timeout_s=timeout_s, abandoned=abandoned)
        versions = [served.version] * len(results)
        parts = [(served, queries, results, "live")]
    else:
        assert beside is not None
        live_q = [q for q, p in zip(queries, picks, strict=True) if not p]
        cand_q = [q for q, p in zip(queries, picks, strict=True) if p]
        live_r, cand_r = await asyncio.gather(
            answer(served, live_q, store=store, timeout_s=timeout_s, abandoned=abandoned) if live_q else _none(),
            answer(beside, cand_q, store=store, timeout_s=timeout_s, abandoned=abandoned),
        )
        live_it, cand_it = iter(live_r), iter(cand_r)
        results = [next(cand_it) if p else next(live_it) for p in picks]
        versions = [beside.version if p else served.version for p in picks]
        parts = [(served, live_q, live_r, "live"), (beside, cand_q, cand_r, "canary")]
    if lists is not None:
        now = time.time()
        since = beside.candidate.since if beside is not None and beside.candidate is not None else None
        for entry, qs, rs, variant in parts:
            record(lists, entry, qs, rs, variant=variant, now=now, trial_start=since)
    if beside is not None and not canary and shadows is not None:
        by_user = [q for q in queries if subject(served, q) is not None]
        if by_user:
            shadows.offer(served, beside, by_user, store=store, timeout_s=timeout_s, lists=lists)
    return results, versions


async def _none() -> list[Any]:
    return []
