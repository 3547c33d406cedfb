"""A candidate on trial beside the live version, on the request path: a canary answers its share of the
users, an interleaved candidate's list is mixed with the live one in every by-user answer
(app/production/interleave.py), a shadow is offered the by-user queries once the live answer is ready (never awaited
by a request), and what each side served by user is kept for online evaluation (app/production/online.py), under
the answer's recommendation_id. A trial is a candidate's run from its `since` (app/choices.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.answering import answer, subject
from app.batcher import AbandonedError
from app.errors import DomainError
from app.loaded import Served, held
from app.observability import Metrics
from app.production.interleave import seed_of, team_draft
from app.production.online import CUT, ServedLists
from app.production.traffic import VersionTraffic
from app.store import HistoryStore
from models.engine import UserHistories
from models.queries import QueryError

log = logging.getLogger(__name__)


def in_canary(model: str, user: str, share: float) -> bool:
    """Whether `user` is in the canary share of `model`: a hash of both, so the split is the same on
    every worker, host and restart (Python's hash() is salted per process), and differs per model."""
    return _position(model, user) < share


def in_holdback(model: str, user: str, share: float) -> bool:
    """Whether `user` is in the holdback share of `model`: the canary hash's other end, so the users a
    promotion's canary left on the live version (up to 1 - share of them) stay on it while it is held back."""
    return _position(model, user) >= 1.0 - share


def _position(model: str, user: str) -> float:
    """Where `user` falls in [0, 1) for `model`: a hash of both, the same on every worker, host and restart."""
    h = hashlib.blake2b(f"{model}\x00{user}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64


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
        recommendation_ids: Sequence[str | None],
    ) -> None:
        """`recommendation_ids`: the live answers' (an event naming one scores the shadow's list of that query too)."""
        if self.running >= self.max_in_flight or live.batcher.depth > 0 or beside.batcher.depth > 0:
            self.shed[live.name] = self.shed.get(live.name, 0) + 1
            return
        self.running += 1
        task = asyncio.get_running_loop().create_task(
            self._run(beside, queries, store=store, timeout_s=timeout_s, lists=lists, ids=recommendation_ids)
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
        ids: Sequence[str | None],
    ) -> None:
        try:
            with held(beside):
                results = await answer(beside, queries, store=store, timeout_s=timeout_s)
            if lists is not None:
                since = beside.role.since if beside.role is not None else None
                record(lists, beside, queries, results, variant="shadow", now=time.time(), trial_start=since, ids=ids)
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


def new_id() -> str:
    """A recommendation_id: 96 random bits, so nobody can name (and score) an answer they were not given."""
    return secrets.token_urlsafe(12)


def record(
    lists: ServedLists,
    served: Served,
    queries: Sequence[Any],
    results: Sequence[Any],
    *,
    variant: str,
    now: float,
    ids: Sequence[str | None],
    trial_start: float | None = None,
    teams: Sequence[str] | None = None,
) -> None:
    """Keep what each by-user query was served, to score it against the user's next event or the event
    naming its recommendation_id (`ids`, per query); `trial_start`: when the trial running for this model
    began (its candidate's `since`), whose figures are also kept per user; `teams`: an interleaved answer's."""
    engine = served.engine
    if not isinstance(engine, UserHistories):
        return
    namespace = engine.namespace
    for n, (q, r, rid) in enumerate(zip(queries, results, ids, strict=True)):
        user = engine.subject(q)
        if user is not None:
            # Only the top CUT: what the figures score; a list of k = 1000 held whole was 8-11 KB a user.
            top = tuple(engine.ranked(r))[:CUT]
            team = teams[n][:CUT] if teams is not None else ""
            floor = tuple(engine.floor(r))[:CUT] if variant == "live" else ()
            fallback = engine.source(r) != "model"
            lists.record(
                namespace,
                user,
                (served.name, served.version, variant, top, now, trial_start, team, rid or "", floor, fallback),
            )


@dataclass(frozen=True)
class AnswerContext:
    """What answering one request needs besides its models and queries. `probation`: when the live version
    was promoted, while probation watches it; with no trial running, its lists are then kept per user from
    that time (app/production/promotion.py), and so are those of the holdback (the version it replaced,
    answering its share of the users). `traffic` (a key holder's request): each part a version computed, in
    a request holding a by-user query, is counted for it (app/production/traffic.py)."""

    store: HistoryStore | None
    timeout_s: float
    abandoned: Callable[[], bool] | None = None  # true once the client has gone
    lists: ServedLists | None = None
    shadows: ShadowWork | None = None
    metrics: Metrics | None = None
    probation: float | None = None
    traffic: VersionTraffic | None = None


async def answer_with_candidate(
    served: Served, beside: Served | None, queries: Sequence[Any], ctx: AnswerContext
) -> tuple[list[Any], list[str], list[str | None]]:
    """The live answer (a canary's, for the queries by users in its share; an interleaving of both, for
    every by-user query while the candidate is interleaved), each result with the version that gave it
    (an interleaved one: the candidate's) and, for a by-user query, a new recommendation_id; the by-user
    answers are kept in `ctx.lists`, and a shadow candidate is offered the by-user queries once the live
    answer is ready."""
    store, timeout_s, abandoned, lists = ctx.store, ctx.timeout_s, ctx.abandoned, ctx.lists
    shadows, metrics, probation, traffic = ctx.shadows, ctx.metrics, ctx.probation, ctx.traffic
    if beside is not None and (beside.role is None or beside.version == served.version):
        beside = None  # promoted a moment ago: it is dropped once this reload ends
    role = beside.role if beside is not None else None
    mode = role.variant if role is not None else None
    users = [subject(served, q) for q in queries]
    ids = [new_id() if u is not None else None for u in users]
    if mode == "interleave" and any(u is not None for u in users):
        assert beside is not None
        return await _interleaved(
            served,
            beside,
            queries,
            users,
            ids,
            store=store,
            timeout_s=timeout_s,
            abandoned=abandoned,
            lists=lists,
            metrics=metrics,
        )
    picks = [False] * len(queries)
    if mode in ("canary", "holdback"):
        assert role is not None
        split = in_canary if mode == "canary" else in_holdback
        picks = [u is not None and split(served.name, u, role.share) for u in users]
    # Only a request holding a by-user query counts a version's answers (the holdback answers by-user queries
    # alone, so both sides see the same kind); the router passes `traffic` for a key holder's requests only.
    counted = traffic if any(u is not None for u in users) else None
    # (entry, its queries, their results, their ids, variant): the live version alone, or it and the canary
    parts: list[tuple[Served, Sequence[Any], Sequence[Any], Sequence[str | None], str]]
    if not any(picks):
        results = await _part(served, queries, store=store, timeout_s=timeout_s, abandoned=abandoned, traffic=counted)
        versions = [served.version] * len(results)
        parts = [(served, queries, results, ids, "live")]
    else:
        assert beside is not None
        live_q = [q for q, p in zip(queries, picks, strict=True) if not p]
        cand_q = [q for q, p in zip(queries, picks, strict=True) if p]
        live_r, cand_r = await asyncio.gather(
            _part(served, live_q, store=store, timeout_s=timeout_s, abandoned=abandoned, traffic=counted)
            if live_q
            else _none(),
            _part(beside, cand_q, store=store, timeout_s=timeout_s, abandoned=abandoned, traffic=counted),
        )
        live_it, cand_it = iter(live_r), iter(cand_r)
        results = [next(cand_it) if p else next(live_it) for p in picks]
        versions = [beside.version if p else served.version for p in picks]
        live_ids = [i for i, p in zip(ids, picks, strict=True) if not p]
        cand_ids = [i for i, p in zip(ids, picks, strict=True) if p]
        assert mode is not None
        parts = [(served, live_q, live_r, live_ids, "live"), (beside, cand_q, cand_r, cand_ids, mode)]
    if lists is not None:
        now = time.time()
        since = role.since if role is not None else probation
        for entry, qs, rs, its, variant in parts:
            record(lists, entry, qs, rs, variant=variant, now=now, ids=its, trial_start=since)
    if beside is not None and mode == "shadow" and shadows is not None:
        by_user = [n for n, u in enumerate(users) if u is not None]
        if by_user:
            shadows.offer(
                served,
                beside,
                [queries[n] for n in by_user],
                store=store,
                timeout_s=timeout_s,
                lists=lists,
                recommendation_ids=[ids[n] for n in by_user],
            )
    return results, versions, ids


async def _interleaved(
    served: Served,
    beside: Served,
    queries: Sequence[Any],
    users: Sequence[str | None],
    ids: Sequence[str | None],
    *,
    store: HistoryStore | None,
    timeout_s: float,
    abandoned: Callable[[], bool] | None,
    lists: ServedLists | None,
    metrics: Metrics | None,
) -> tuple[list[Any], list[str], list[str | None]]:
    """Every query answered by the live version, and each by-user one by the candidate too, its answer
    then a Team-Draft interleaving of the two seeded by the model, user and recommendation_id; when the
    candidate's call fails, the live answers alone (counted)."""
    assert beside.role is not None and isinstance(served.engine, UserHistories)
    engine = served.engine
    by_user = [n for n, u in enumerate(users) if u is not None]
    cand_q = [queries[n] for n in by_user]
    both: tuple[list[Any] | BaseException, list[Any] | BaseException] = await asyncio.gather(
        answer(served, queries, store=store, timeout_s=timeout_s, abandoned=abandoned),
        answer(beside, cand_q, store=store, timeout_s=timeout_s, abandoned=abandoned),
        return_exceptions=True,
    )
    live_r, cand_r = both
    if isinstance(live_r, BaseException):
        raise live_r
    results, versions = list(live_r), [served.version] * len(live_r)
    if isinstance(cand_r, BaseException):  # the candidate's failure is its own: the live answers go out alone
        log.warning(
            "interleaved candidate %s/%s failed, the live answers served: %s", beside.name, beside.version, cand_r
        )
        if metrics is not None:
            metrics.count_candidate_failure(beside.name, "interleave")
        if lists is not None:
            record(lists, served, queries, results, variant="live", now=time.time(), ids=ids)
        return results, versions, list(ids)
    teams: list[str] = []
    for n, theirs in zip(by_user, cand_r, strict=True):
        mine, other = engine.ranked(live_r[n]), engine.ranked(theirs)
        seed = seed_of(served.name, str(users[n]), str(ids[n]))
        picks, team = team_draft(mine, other, max(len(mine), len(other)), seed=seed)
        results[n] = engine.interleaved(live_r[n], theirs, picks)
        versions[n] = beside.version
        teams.append(team)
    if lists is not None:
        mixed = [results[n] for n in by_user]
        record(
            lists,
            beside,
            cand_q,
            mixed,
            variant="interleave",
            now=time.time(),
            ids=[ids[n] for n in by_user],
            trial_start=beside.role.since,
            teams=teams,
        )
    return results, versions, list(ids)


async def _none() -> list[Any]:
    return []


# What a request's own input or its client causes, not the version: never counted against it.
_NOT_THE_VERSIONS = (QueryError, DomainError, AbandonedError)


async def _part(
    served: Served,
    queries: Sequence[Any],
    *,
    store: HistoryStore | None,
    timeout_s: float,
    abandoned: Callable[[], bool] | None,
    traffic: VersionTraffic | None,
) -> list[Any]:
    """`served`'s answers to its part of a request, counted in `traffic` when given: its cost per query, and
    a failure of the version's own (a timeout, a full queue, an error in the model; not a bad query, a store
    away or a client gone)."""
    if traffic is None:
        return await answer(served, queries, store=store, timeout_s=timeout_s, abandoned=abandoned)
    t0 = time.perf_counter()
    try:
        out = await answer(served, queries, store=store, timeout_s=timeout_s, abandoned=abandoned)
    except _NOT_THE_VERSIONS:
        raise
    except Exception:
        traffic.observe(served.name, served.version, failed=True, seconds=_per_query(t0, queries))
        raise
    traffic.observe(served.name, served.version, failed=False, seconds=_per_query(t0, queries))
    return out


def _per_query(t0: float, queries: Sequence[Any]) -> float:
    return (time.perf_counter() - t0) / max(1, len(queries))
