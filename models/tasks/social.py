"""Whom a user will interact with next (the social model): the artifact and the served engine.

Queries and results are the recommendation route's (`RecQuery`, `RecResult`): the "items" are users.
Each history step needs its action. Defaults differ from item recommendation where the data does:
already-interacted users stay candidates (repeat interactions are the common case) unless a query
asks otherwise, the actor is never a candidate, and "future" means a user whose first activity is
after the reference time (`as_of`, else the newest step of the history): not yet on the platform.
A model trained with incoming steps ("<-a2q": someone answered the user's question) reads them like
any step; they never count as users the actor interacted with, and each event a client posts adds
its incoming step to the target's timeline too (`received_step`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pydantic import TypeAdapter

from models import artifact
from models.activity import Activity, EventLog, as_tensors, merge, recent_activity, stack
from models.catalog import CatalogRules
from models.engine import Actions, EngineOptions, RecentActivity, optional_time
from models.history_table import HistoryTable
from models.ids import N_SPECIAL, UNK, IdMap
from models.manifest import Manifest
from models.queries import QueryError, RecentEvent, Timeline
from models.ranking import Ranked, future_mask, index_rows, rank_sparse, release_tensor
from models.social import SocialBatch, SocialModel, incoming, is_incoming, pack_steps
from models.tasks.recommend import (
    WARM_UP_USER,
    Prepared,
    RecQuery,
    RecResult,
    UserQueryEngine,
    check_filter_work,
    check_query,
    check_spread,
    ranked_results,
    unknown_user,
    wanted_k,
)
from models.traced import example_rows, serving_scores

_FIRST: TypeAdapter[dict[str, float]] = TypeAdapter(dict[str, float])


@dataclass
class SocialArtifact:
    folder: Path
    manifest: Manifest
    model: SocialModel
    users: IdMap
    actions: IdMap
    first_activity: dict[str, float]  # raw user id -> unix time of their first event
    histories: HistoryTable  # actor -> steps (target, unix time, action), oldest first; memory-mapped
    events: EventLog | None  # the log in time order, for a model that takes recent activity


def load_artifact(folder: Path, map_location: str | torch.device = "cpu") -> SocialArtifact:
    """Load and cross-check a social artifact; raises ArtifactError on any defect."""
    manifest = artifact.read_manifest(folder)
    model: SocialModel = artifact.read_model(folder, manifest, SocialModel, map_location)
    users, actions = artifact.read_id_map(folder, artifact.USERS), artifact.read_id_map(folder, artifact.ACTIONS)
    artifact.check(
        model.config.n_users == len(users), artifact.USERS, f"{len(users)} ids for {model.config.n_users} model users"
    )
    artifact.check(
        model.config.n_actions == len(actions),
        artifact.ACTIONS,
        f"{len(actions)} ids for {model.config.n_actions} model actions",
    )
    meta = artifact.read_json(folder, artifact.USER_META)
    artifact.check(isinstance(meta, dict) and meta.get("unit") == "second", artifact.USER_META, "unit must be 'second'")
    try:
        first = _FIRST.validate_python(meta.get("first_activity", {}))
    except ValueError:
        raise artifact.ArtifactError(artifact.USER_META, "first_activity must map user ids to unix times") from None
    histories = artifact.read_history_table(folder, n_ids=len(users), n_actions=len(actions))
    artifact.check(histories.actions is not None, artifact.HISTORIES, "a social model's histories need actions.npy")
    events = artifact.read_event_log(folder) if model.config.activity else None
    if events is not None:
        top = max(int(events.made.max(initial=0)), int(events.received.max(initial=0)))
        artifact.check(top < len(users), artifact.EVENTS, f"user index {top} for {len(users)} model users")
        top = int(events.actions.max(initial=0))
        artifact.check(top < len(actions), artifact.EVENTS, f"action index {top} for {len(actions)} model actions")
    return SocialArtifact(folder, manifest, model, users, actions, first, histories, events)


@dataclass
class SocialExtra:
    steps: list[tuple[int, int, float]]  # (target index, action index, unix time), oldest first
    query_time: float
    activity: Activity | None = None  # recent activity at query_time, the live events' included


class SocialEngine(UserQueryEngine, Actions, RecentActivity[Prepared]):
    exclude_seen_default = False  # people are contacted again and again

    def __init__(self, art: SocialArtifact, options: EngineOptions) -> None:
        self.art = art
        self.manifest = art.manifest
        self.device = options.device
        self.live_events = options.live_events
        self.histories, self.entity_ids, self.action_ids = art.histories, art.users, art.actions
        self.model = (art.model.half() if options.half else art.model).to(self.device).eval()
        self.scores, self.scoring = serving_scores(self.model, self._examples, enabled=options.trace)
        self.first = release_tensor(art.users.raws(), art.first_activity).to(self.device)
        self.two_way = any(is_incoming(a) for a in art.actions.raws())
        # Per action index: whether it is an incoming step (never a user the actor interacted with).
        self.incoming = np.array([False] * N_SPECIAL + [is_incoming(a) for a in art.actions.raws()], dtype=bool)
        self.rules = CatalogRules(art.users, {}, self.device)  # no fields: the ids themselves may be filtered

    @property
    def catalog_size(self) -> int:
        return self.art.users.n_entities

    def _stored(self, user: str) -> tuple[list[tuple[int, int, float]], list[int]] | None:
        """A user's newest stored steps (the model's window) and everyone it acted on (read from the table)."""
        row = self.art.histories.get(user)
        if row is None or row.actions is None:
            return None
        x = np.where(row.items < len(self.art.users), row.items, UNK)
        acts = np.clip(row.actions, 0, len(self.incoming) - 1)
        w = slice(max(0, len(x) - self.model.config.max_history), None)
        steps = list(zip(x[w].tolist(), acts[w].tolist(), row.times[w].tolist(), strict=True))
        return steps, np.unique(x[~self.incoming[acts] & (x >= N_SPECIAL)]).tolist()

    @property
    def actions(self) -> list[str]:
        return list(self.art.actions.raws())

    def check_action(self, action: str | None) -> str | None:
        """An event's action: one the user performed (its incoming form is added to the target's timeline)."""
        problem = self.check_step(action)
        if problem is None and is_incoming(action):
            return (
                f"{action!r} is what a user receives; post the event as its actor's, with one of "
                f"{[a for a in self.art.actions.raws() if not is_incoming(a)]}"
            )
        return problem

    def check_step(self, action: str | None) -> str | None:
        """A history step's action: any of the vocabulary, incoming forms included."""
        if action is None:
            return f"required by social model {self.manifest.name!r}; one of {self.art.actions.raws()}"
        if action not in self.art.actions:
            return f"unknown action {action!r}; this model knows {self.art.actions.raws()}"
        return None

    def received_step(self, user_id: str, item_id: str, action: str | None) -> tuple[str, str, str | None] | None:
        if not self.two_way or action is None or user_id == item_id:
            return None
        return item_id, user_id, incoming(action)

    def is_received(self, action: str | None) -> bool:
        return is_incoming(action)

    def known(self, raw_ids: Sequence[str]) -> list[bool]:
        return [x >= N_SPECIAL for x in self.art.users.indices(raw_ids)]

    def prepare(self, queries: Sequence[RecQuery], live: Mapping[str, Timeline]) -> list[Prepared]:
        return check_filter_work(
            [self._prepare(q, n, live.get(q.user_id, []) if q.user_id else []) for n, q in enumerate(queries)]
        )

    def _prepare(self, q: RecQuery, position: int, live: Timeline) -> Prepared:
        rule = check_query(q, position, fields={}, rules=self.rules)  # no item fields: users are what it ranks
        check_spread(q, position, fields={})  # none to spread by
        for j, (_, _, action) in enumerate(q.history):
            problem = self.check_step(action)
            if problem:
                raise QueryError(problem, position=position, field=("history", j, "action"))
        stored: tuple[list[tuple[int, int, float]], list[int]] = ([], [])
        requested = [x for x in self.art.users.indices(q.exclude_items) if x >= N_SPECIAL]
        if q.user_id is not None:
            found = self._stored(q.user_id)
            if found is None and not q.history and not live:
                # The users most contacted recently; not yet active ones stay out as of now.
                now = q.as_of if q.as_of is not None else time.time()
                return unknown_user(
                    q, position, requested=requested, reference=now if q.exclude_future else None, rule=rule
                )
            stored = found or stored
        stored_last = stored[0][-1][2] if stored[0] else None
        events = [(i, optional_time(t), a) for i, t, a in live] + list(q.history)
        given = self.art.users.indices([i for i, _, _ in events])
        acts = self.art.actions.indices([a or "" for _, _, a in events])
        times = [t for _, t, _ in events if t is not None]
        last = max([*times, *([stored_last] if stored_last is not None else [])], default=None)
        when = q.as_of if q.as_of is not None else last
        # A step without a time is taken as happening at the query: the newest time bucket.
        query_time = when if when is not None else 0.0
        steps = stored[0] + [
            (x, a, query_time if t is None else t) for x, a, (_, t, _) in zip(given, acts, events, strict=True)
        ]
        seen = sorted(
            set(stored[1])
            | {x for x, (_, _, a) in zip(given, events, strict=True) if x >= N_SPECIAL and not is_incoming(a)}
        )
        actor = self.art.users.index(q.user_id) if q.user_id is not None else UNK
        return Prepared(
            query=q,
            history=seen,
            exclude_seen=self.exclude_seen_default if q.exclude_seen is None else q.exclude_seen,
            requested=requested + ([actor] if actor >= N_SPECIAL else []),
            # Only the query's own ids: stored and live steps are never echoed (docs/decisions/private-histories.md).
            unknown=list(
                dict.fromkeys(i for (i, _, _), x in zip(q.history, given[len(live) :], strict=True) if x < N_SPECIAL)
            ),
            reference=when if q.exclude_future else None,
            extra=SocialExtra(steps, query_time),
            filter=rule,
        )

    def future(self, batch: Sequence[Prepared]) -> torch.Tensor | None:
        ref = torch.tensor([math.inf if p.reference is None else p.reference for p in batch], device=self.device)
        return future_mask(self.first, ref)

    def recent_span(self, prepared: Sequence[Prepared]) -> tuple[float, float] | None:
        windows = self.model.config.activity
        if not windows or not prepared:
            return None
        times = [p.extra.query_time for p in prepared if isinstance(p.extra, SocialExtra)]
        if not times:  # unknown users alone: the fallback reads no activity
            return None
        return min(times) - max(windows), max(times)

    @property
    def recent_reach_s(self) -> float:
        return max(self.model.config.activity, default=0.0)

    def add_recent(self, prepared: Sequence[Prepared], events: Sequence[RecentEvent]) -> None:
        if not self.model.config.activity:
            return
        self._attach([p.extra for p in prepared if isinstance(p.extra, SocialExtra)], events)

    def _attach(self, extras: list[SocialExtra], live: Sequence[RecentEvent]) -> None:
        n = min(self.model.config.activity_contacts, self.model.config.max_history)
        contacts = None
        if n:  # the targets of each history's newest n steps, as the model's window has them
            contacts = np.zeros((len(extras), n), np.int64)
            for i, e in enumerate(extras):
                last = [x for x, _, _ in e.steps[-n:]]
                contacts[i, n - len(last) :] = last
        found = self._activity([e.query_time for e in extras], live, contacts)
        for i, e in enumerate(extras):
            e.activity = found.row(i)

    def _activity(self, query_times: list[float], live: Sequence[RecentEvent], contacts: np.ndarray | None) -> Activity:
        """Recent activity at each time: the artifact's log, plus live events (oldest first; those after
        the log, usually)."""
        c, log = self.model.config, self.art.events
        assert log is not None
        q = np.asarray(query_times, dtype=np.float64)

        def count(times: np.ndarray, made: np.ndarray, received: np.ndarray, actions: np.ndarray) -> Activity:
            return recent_activity(
                times,
                made=made,
                received=received,
                query_times=q,
                windows=c.activity,
                contacts=contacts,
                actions=actions if c.activity_per_action else None,
                n_actions=c.n_own_actions,
            )

        stored = count(log.times, log.made, log.received, log.actions)
        if not live:
            return stored
        return merge(
            stored,
            count(
                np.asarray([e[2] for e in live], dtype=np.float64),
                np.asarray(self.art.users.indices([e[0] for e in live]), dtype=np.int64),
                np.asarray(self.art.users.indices([e[1] for e in live]), dtype=np.int64),
                np.asarray(self.art.actions.indices([e[3] or "" for e in live]), dtype=np.int64),
            ),
        )

    def _examples(self) -> list[SocialBatch]:
        c, now = self.model.config, 1.7e9
        rows = example_rows(N_SPECIAL, N_SPECIAL + self.art.users.n_entities, max_len=c.max_history)
        # Steps an hour apart before the query, so the batches span the time buckets.
        out = []
        for batch in rows:
            b = pack_steps(
                [
                    [
                        (x, N_SPECIAL + x % max(1, c.n_actions - N_SPECIAL), now - 3600.0 * (len(r) - i))
                        for i, x in enumerate(r)
                    ]
                    for r in batch
                ],
                query_times=[now] * len(batch),
                max_history=c.max_history,
                n_buckets=c.n_time_buckets,
            )
            if c.activity:  # each row's targets as recently active: the batches differ in their entries
                b.activity_index = torch.tensor(
                    [[i for i, r in enumerate(batch) for _ in r], [x for r in batch for x in r]]
                )
                b.activity_counts = torch.ones(sum(map(len, batch)), c.n_activity)
            out.append(b.to(self.device))
        return out

    def run(self, batch: list[Prepared]) -> Ranked:
        c = self.model.config
        extras = [p.extra for p in batch]
        assert all(isinstance(e, SocialExtra) for e in extras)
        social = [e for e in extras if isinstance(e, SocialExtra)]
        b = pack_steps(
            [e.steps for e in social],
            query_times=[e.query_time for e in social],
            max_history=c.max_history,
            n_buckets=c.n_time_buckets,
        )
        if c.activity:
            # Queries no live events were added to (offline prediction): the artifact's log alone.
            self._attach([e for e in social if e.activity is None], [])
            b.activity_index, b.activity_counts = as_tensors(
                stack([e.activity for e in social if e.activity is not None], c.n_activity)
            )
        b = b.to(self.device)
        scores = self.scores(b).float()
        seen = index_rows([p.history if p.exclude_seen else [] for p in batch], self.device)
        return rank_sparse(
            scores,
            wanted_k(batch, len(self.art.users)),
            seen=seen,
            future=self.future(batch),
            requested=index_rows([p.requested for p in batch], self.device),
            blocked=self.rules.blocked([p.filter for p in batch]),
            floor=self.popular,
        )

    def results(self, batch: list[Prepared], output: Ranked) -> list[RecResult]:
        return ranked_results(batch, output, raw=self.art.users.raw, max_history=self.model.config.max_history)

    def warm_up(self) -> None:
        some = self.art.users.raw(N_SPECIAL) or ""
        self.answer([RecQuery(None, [(some, None, self.art.actions.raw(N_SPECIAL))], k=1), RecQuery(WARM_UP_USER)])
