"""The protocol every served task implements, framework-free: raw queries in, raw results out.

An engine holds one loaded artifact on one device. Serving a request is three hooks:
  prepare(queries, live)  raw ids -> indices, per query; cheap, on the caller's thread; raises QueryError
  run(batch)              one forward pass over the prepared queries of many requests -> tensors
  results(batch, output)  tensors -> raw ids and scores, per query
`infer` is run + results: what a micro-batcher calls with the queries of several requests.
That is the core (`Engine`); what only some tasks do is a capability of its own (`UserHistories`,
`ItemDisplay`, `Actions`, `RecentActivity`), which an engine inherits and the serving code checks for.
Training's batch prediction uses the same engine, so serving and offline prediction cannot drift.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from models.catalog import CatalogRules
from models.manifest import Manifest
from models.queries import COARSE_FROM, LIVE_EVENTS, RecentEvent, Timeline

Q = TypeVar("Q")  # a raw query
P = TypeVar("P")  # a prepared query
R = TypeVar("R")  # a result

HEAD_SHARE = 0.01  # the popular head: served lists are measured by the share of their items in it


@dataclass
class EngineOptions:
    """How the service places an artifact: device, precision, and the live-history bound."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    half: bool = False  # float16 weights (CUDA only)
    live_events: int = LIVE_EVENTS  # newest live events per user read for a query (seen exclusion included)
    trace: bool = True  # serve scores() as one traced graph where it traces exactly (models/traced.py)
    coarse_from: int | None = COARSE_FROM  # None: every catalog ranked from float32 scores


# Display field names: what a request may ask for (app/schemas.py validates against these) and what an
# artifact may declare; a name outside them could never be asked for.
FIELD_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
MAX_FIELDS = 16  # distinct display fields a query may ask for, and an artifact may have


def unknown_field(asked: Sequence[str], available: Collection[str]) -> tuple[int, str] | None:
    """The first asked display field the model lacks, as (its index, the message), else None."""
    for n, name in enumerate(asked):
        if name not in available:
            has = f"this model has {sorted(available)}" if available else "this model has no item fields"
            return n, f"unknown field {name!r}; {has}"
    return None


def optional_time(t: float | None) -> float | None:
    """NaN (the store's 'no time') as None."""
    return None if t is None or math.isnan(t) else t


class Engine(ABC, Generic[Q, P, R]):
    """One loaded artifact on one device, answering batches of raw queries: the core every served task
    implements. What only some tasks do is a capability below, which the serving code checks for."""

    manifest: Manifest
    device: torch.device
    scoring: str = "eager"  # how scores() runs: "traced", or "eager" and why (models/traced.py)

    @property
    @abstractmethod
    def catalog_size(self) -> int:
        """Entities the model ranks (items, places, users)."""

    @abstractmethod
    def prepare(self, queries: Sequence[Q], live: Mapping[str, Timeline]) -> list[P]: ...

    @abstractmethod
    def run(self, batch: list[P]) -> Any: ...

    @abstractmethod
    def results(self, batch: list[P], output: Any) -> list[R]: ...

    @abstractmethod
    def warm_up(self) -> None:
        """One tiny query through every hook, so the first request pays no lazy initialisation."""

    def infer(self, batch: list[P]) -> list[R]:
        with torch.inference_mode():
            return self.results(batch, self.run(batch))

    def answer(self, queries: Sequence[Q], live: Mapping[str, Timeline] | None = None) -> list[R]:
        """prepare + infer in one call, for offline use and tests."""
        return self.infer(self.prepare(queries, live or {}))


# --- capabilities: what some engines offer beside the core ---------------------------------------------


class UserHistories(ABC, Generic[Q, R]):
    """Queries by user id over per-user histories: the artifact's table, plus the live events the
    history store keeps in `namespace` (POST /events writes them). Its by-user answers can be scored
    against the user's next event."""

    exclude_seen_default: bool = True  # whether a query that does not say removes the user's earlier items

    @property
    @abstractmethod
    def namespace(self) -> str:
        """The history store's namespace whose live events the queries read."""

    @property
    @abstractmethod
    def live_budget(self) -> int:
        """Newest live events per user that prepare() can use (the model's window plus exclusions)."""

    @abstractmethod
    def users(self, queries: Sequence[Q]) -> list[str]:
        """Users whose live events the queries need."""

    @abstractmethod
    def subject(self, query: Q) -> str | None:
        """The stored user a query asks about (its answer can be scored against that user's next event,
        and a canary split is sticky by it); None for a query that carries its whole history."""

    @abstractmethod
    def ranked(self, result: R) -> list[str]:
        """The raw ids of an answer, best first (what a user was shown)."""

    @abstractmethod
    def floor(self, result: R) -> list[str]:
        """The raw ids of an answer's reference list (the version's most frequent items that the answer's own
        exclusions leave, models.ranking.Popular), best first: what online evaluation scores beside the
        answer as its floor."""

    def source(self, result: R) -> str:
        """Where an answer's list came from: "model", or the fallback's source for a user it does not know
        (online evaluation scores those lists as their own segment)."""
        return "model"

    @abstractmethod
    def interleaved(self, first: R, second: R, picks: Sequence[tuple[int, int]]) -> R:
        """One answer made of two answers to the same query: its i-th item is `picks[i]` = (0: `first`'s,
        1: `second`'s; that answer's index), each with its own score; the rest (exclusions, unknown ids)
        is `first`'s."""

    @abstractmethod
    def stored_timeline(self, user: str) -> Timeline:
        """The artifact's history of `user`, oldest first; empty when it has none."""

    def stored_events(self, user: str) -> set[tuple[str | None, float | None]]:
        """The artifact's own events of `user` as (raw id, time) keys. A live event among them was in
        the data this artifact was trained on: the store drops it (`drop_trained_events`, once per
        data hash)."""
        return {(r, optional_time(t)) for r, t, _ in self.stored_timeline(user)}

    @abstractmethod
    def known(self, raw_ids: Sequence[str]) -> list[bool]:
        """Per raw id: whether the model knows it (an unknown one counts after the next training run)."""

    @abstractmethod
    def has_history(self, user: str) -> bool:
        """Whether the artifact's table holds `user` (if not, the model knows the user from live events only)."""

    @property
    @abstractmethod
    def catalog_size(self) -> int:
        """How many ids the model ranks (what the served lists' coverage is a share of)."""

    @property
    @abstractmethod
    def head_items(self) -> frozenset[str]:
        """The popular head: the 1% most frequent raw ids of the artifact's histories (HEAD_SHARE)."""

    @property
    @abstractmethod
    def fresh_items(self) -> frozenset[str]:
        """The raw ids this version knows only because a warm retrain met them in live events."""


class Catalog(ABC):
    """Business rules over what the engine ranks (models/catalog.py): hidden items and each query's filter
    come out in the ranking pass, and a user the version does not know is answered from what users take
    now. The service sets `rules`' hidden items and recent takes; the engine reads them per batch."""

    rules: CatalogRules


@dataclass
class SimilarQuery:
    item_id: str
    k: int = 10
    filter: object = None  # as for /recommend (models/catalog.py)
    exclude_items: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)


@dataclass
class SimilarResult:
    item_id: str
    source: str  # models.similar.SOURCES
    items: list[tuple[str, float]]
    excluded: dict[str, int]  # requested, filtered
    fields: list[dict[str, Any]] | None = None


class Neighbours(ABC):
    """Item-to-item answers (models/similar.py): the items most like one item, from the source the training
    job chose on validation, with the catalog's rules applied."""

    @property
    @abstractmethod
    def similar_source(self) -> str:
        """The source its neighbours come from: one of models.similar.SOURCES."""

    @abstractmethod
    def similar(self, query: SimilarQuery) -> SimilarResult:
        """The query's item's neighbours; ItemQueryError (a 4xx) for an unknown item, field or bad filter."""


class ItemDisplay(ABC):
    """Display fields (title, genres, ...) that a query can ask for with the entities the model ranks."""

    @property
    @abstractmethod
    def item_fields(self) -> list[str]:
        """The field names a query may ask for."""

    @abstractmethod
    def describe(self, raw_ids: Sequence[str], fields: Sequence[str]) -> list[dict[str, Any]]:
        """Per raw id, its values of `fields` (names from item_fields); a missing value is left out."""


class Actions(ABC):
    """Steps that carry an action from a vocabulary (a social model's), and events that also add a step
    to another user's timeline (the target sees who acted on them)."""

    @property
    @abstractmethod
    def actions(self) -> list[str]:
        """The actions a history step must carry."""

    @abstractmethod
    def check_action(self, action: str | None) -> str | None:
        """Why an event's action is not acceptable to this model, or None when it is."""

    @abstractmethod
    def received_step(self, user_id: str, item_id: str, action: str | None) -> tuple[str, str, str | None] | None:
        """The step an event of `user_id` also adds to another user's timeline, as (user, item, action);
        None when it adds none."""

    @abstractmethod
    def is_received(self, action: str | None) -> bool:
        """Whether a step with `action` is one that another user's event added (a received step)."""


def received_steps(engine: object) -> Callable[[str | None], bool]:
    """Whether a step's action marks it received (added by another user's event): the engine's own test
    when it has `Actions`, else never."""
    return engine.is_received if isinstance(engine, Actions) else _never_received


def _never_received(action: str | None) -> bool:
    return False


class RecentActivity(ABC, Generic[P]):
    """Prepared queries that also count every user's live events of a recent span (a social model's
    recent activity), handed over before they run."""

    @abstractmethod
    def recent_span(self, prepared: Sequence[P]) -> tuple[float, float] | None:
        """The time span [start, end) of every user's live events that the prepared queries need, or
        None when they need none."""

    @abstractmethod
    def add_recent(self, prepared: Sequence[P], events: Sequence[RecentEvent]) -> None:
        """Hand the prepared queries the live events of `recent_span` (oldest first)."""

    @property
    @abstractmethod
    def recent_reach_s(self) -> float:
        """How far before a query its recent events go (the longest window, seconds); 0: none."""
