"""Raw-id queries -> one forward pass -> ranked raw ids, for one loaded recommendation artifact."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from app.store import Timeline
from models.artifact import RecArtifact
from models.ids import N_SPECIAL
from models.ranking import recommend, reference_value, release_tensor


class UnknownUserError(LookupError):
    def __init__(self, user_id: str, position: int) -> None:
        super().__init__(f"unknown user {user_id!r} and no history given")
        self.user_id, self.position = user_id, position


@dataclass
class RecQuery:
    user_id: str | None
    history: list[tuple[str, float | None]]  # (raw item id, unix time or None), oldest first
    k: int = 10
    exclude_seen: bool = True
    exclude_future: bool = True
    exclude_items: list[str] = field(default_factory=list)
    as_of: float | None = None


@dataclass
class Prepared:
    """A query with its ids mapped: what the batcher carries to the model."""

    query: RecQuery
    history: list[int]
    requested: list[int]
    unknown: list[str]
    reference: float | None  # in the release unit; None = no future exclusion


@dataclass
class RecResult:
    user_id: str | None
    items: list[tuple[str, float]]
    unknown_items: list[str]
    excluded: dict[str, int]
    history_truncated: bool = False  # longer than the model reads: the most recent items were used


class Recommender:
    """A recommendation artifact placed on a device, answering batches of queries."""

    def __init__(self, art: RecArtifact, device: torch.device, half: bool = False) -> None:
        self.art = art
        self.device = device
        self.model = (art.model.half() if half else art.model).to(device).eval()
        self.release = (
            release_tensor(art.items.raws(), art.release).to(device) if art.release_unit else None
        )
        # Stored histories mapped once at load, not on every request: (known item indices, last time).
        self.stored: dict[str, tuple[list[int], float | None]] = {}
        for user, events in art.histories.items():
            times = [t for _, t in events if not math.isnan(t)]
            known = [x for x in art.items.indices([i for i, _ in events]) if x >= N_SPECIAL]
            self.stored[user] = (known, max(times) if times else None)

    @property
    def catalog_size(self) -> int:
        return self.art.items.n_entities

    @property
    def namespace(self) -> str:
        """The history store's namespace: the data set's name, shared by every model trained on it."""
        data = self.art.manifest.get("config", {}).get("data", {})
        name = data.get("name") if isinstance(data, dict) else None
        return str(name or self.art.manifest.get("name") or self.art.path.parent.name)

    @property
    def seed_token(self) -> str:
        """Identifies the base histories: the training data's hash."""
        return str(self.art.manifest.get("data", {}).get("sha256") or self.art.manifest["version"])

    def prepare(self, queries: list[RecQuery], live: Mapping[str, Timeline] | None = None) -> list[Prepared]:
        """Map raw ids to indices; raises UnknownUserError naming the query. Cheap: no model call.

        `live` holds the users' events from the history store (appended since the artifact was made).
        """
        live = live or {}
        return [self._prepare(q, n, live.get(q.user_id, []) if q.user_id else []) for n, q in enumerate(queries)]

    def _prepare(self, q: RecQuery, position: int, live: Timeline) -> Prepared:
        stored: tuple[list[int], float | None] = ([], None)
        if q.user_id is not None:
            found = self.stored.get(q.user_id)
            if found is None and not q.history and not live:
                raise UnknownUserError(q.user_id, position)
            stored = found or stored
        events = [(i, None if math.isnan(t) else t) for i, t in live] + list(q.history)
        given = self.art.items.indices([i for i, _ in events])
        unknown = [i for (i, _), x in zip(events, given, strict=True) if x < N_SPECIAL]
        ref = None
        if q.exclude_future and self.art.release_unit:
            times = [t for _, t in events if t is not None] + ([stored[1]] if stored[1] is not None else [])
            when = q.as_of if q.as_of is not None else (max(times) if times else None)
            ref = reference_value(when, self.art.release_unit) if when is not None else None
        return Prepared(
            query=q,
            history=stored[0] + [x for x in given if x >= N_SPECIAL],
            requested=[x for x in self.art.items.indices(q.exclude_items) if x >= N_SPECIAL],
            unknown=list(dict.fromkeys(unknown)),
            reference=ref,
        )

    def recommend(self, queries: list[RecQuery]) -> list[RecResult]:
        return self.infer(self.prepare(queries))

    def infer(self, batch: list[Prepared]) -> list[RecResult]:
        """All prepared queries go through one forward pass."""
        k = max(p.query.k for p in batch)
        with torch.inference_mode():
            ranked = recommend(
                self.model, [p.history for p in batch], k, [p.query.exclude_seen for p in batch],
                [p.requested for p in batch], self.release, [p.reference for p in batch], self.device,
            )
        idx = ranked.indices.cpu().tolist()
        scores = ranked.scores.cpu().tolist()
        counts = torch.stack([ranked.n_seen, ranked.n_future, ranked.n_requested], 1).cpu().tolist()
        raw = self.art.items.raw
        out = []
        for row, p in enumerate(batch):
            kq = p.query.k
            items = [(str(raw(i)), float(s)) for i, s in zip(idx[row][:kq], scores[row][:kq], strict=True)
                     if s != -math.inf]
            seen, fut, req = counts[row]
            excluded = {"seen": seen, "future": fut, "requested": req}
            truncated = len(p.history) > self.model.max_history
            out.append(RecResult(p.query.user_id, items, p.unknown, excluded, truncated))
        return out
