"""Next-item recommendation (SASRec, BERT4Rec): the artifact, the query types and the served engine."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import TypeAdapter

from models import artifact
from models.base import SequentialRecommender
from models.catalog import (
    MAX_PER_POOL,
    MAX_REQUEST_FILTER_NODES,
    CatalogRules,
    FieldValue,
    FilterError,
    ItemFields,
    Node,
    Spread,
    parse_spread,
)
from models.catalog import size as filter_size
from models.coarse import wide_ranker
from models.engine import (
    FIELD_NAME,
    HEAD_SHARE,
    MAX_FIELDS,
    Catalog,
    Engine,
    EngineOptions,
    ItemDisplay,
    Neighbours,
    SimilarQuery,
    SimilarResult,
    UserHistories,
    optional_time,
    unknown_field,
)
from models.history_table import HistoryTable
from models.ids import N_SPECIAL, PAD, IdMap
from models.manifest import Manifest
from models.queries import ItemQueryError, QueryError, Timeline, UnknownItemError, UnknownUserError
from models.ranking import (
    FLOOR_HEAD,
    RELEASE_UNITS,
    Popular,
    Ranked,
    SeqRanker,
    future_mask,
    index_rows,
    pack_histories,
    rank_sparse,
    recommend,
    reference_value,
    release_tensor,
)
from models.similar import COUNTED, SIMILAR_ITEMS, cosine_scores, read_table, rows_of, table_scores
from models.traced import example_rows, serving_scores
from models.warm import first_seen_live

# An interaction as requests and histories carry it: (raw id, unix time or None, action or None).
Step = tuple[str, float | None, str | None]

_ITEM_META: TypeAdapter[dict[str, object]] = TypeAdapter(dict[str, object])
_ITEM_FIELDS: TypeAdapter[dict[str, ItemFields]] = TypeAdapter(dict[str, ItemFields])
_RELEASE: TypeAdapter[dict[str, float]] = TypeAdapter(dict[str, float])


@dataclass
class RecArtifact:
    """Everything the service needs from a recommendation artifact."""

    folder: Path
    manifest: Manifest
    model: SequentialRecommender
    items: IdMap
    release_unit: str | None
    release: dict[str, float]  # raw item id -> release time in release_unit
    histories: HistoryTable  # each user's final items, memory-mapped; its keys are the users
    fields: ItemFields = field(default_factory=dict)  # display fields answers can ask for
    similar: tuple[np.ndarray, np.ndarray] | None = None  # the neighbour table (models/similar.py), if any
    similar_source: str = "embedding"


def load_artifact(folder: Path, map_location: str | torch.device = "cpu") -> RecArtifact:
    """Load and cross-check a recommendation artifact; raises ArtifactError on any defect."""
    manifest = artifact.read_manifest(folder)
    model: SequentialRecommender = artifact.read_model(folder, manifest, SequentialRecommender, map_location)
    items = artifact.read_id_map(folder, artifact.ITEMS)
    artifact.check(
        model.config.vocab_size == len(items),
        artifact.ITEMS,
        f"{len(items)} ids for a model vocabulary of {model.config.vocab_size}",
    )
    meta = artifact.read_typed(folder, artifact.ITEM_META, _ITEM_META)
    unit = meta.get("unit")
    artifact.check(
        unit is None or unit in RELEASE_UNITS, artifact.ITEM_META, f"unit must be one of {RELEASE_UNITS} or null"
    )
    try:
        release = _RELEASE.validate_python(meta.get("release", {}))
    except ValueError:
        raise artifact.ArtifactError(artifact.ITEM_META, "release must map item ids to numbers") from None
    return RecArtifact(
        folder=folder,
        manifest=manifest,
        model=model,
        items=items,
        release_unit=unit if isinstance(unit, str) else None,
        release=release,
        histories=artifact.read_history_table(folder, n_ids=len(items)),
        fields=_read_fields(folder, len(items)),
        **_read_similar(folder, manifest, len(items)),
    )


def _read_similar(folder: Path, manifest: Manifest, size: int) -> dict[str, Any]:
    """The neighbour table and its source, where the job chose a counting source (else the embedding's)."""
    chosen = manifest.metrics.get("similar_items", {})
    source = chosen.get("source", "embedding") if isinstance(chosen, dict) else "embedding"
    if not (folder / SIMILAR_ITEMS).exists():
        artifact.check(source == "embedding", SIMILAR_ITEMS, f"missing: the metrics name source {source!r}")
        return {}
    artifact.check(source in COUNTED, artifact.METRICS, f"similar_items.source {source!r} has no table")
    return {"similar": read_table(folder, size), "similar_source": source}


# item_fields.json is display text: at most this many bytes per catalog item (ml-100k's title and
# genres take about 60), plus a little; a larger file would stall loading and hold its size many times over.
FIELD_BYTES_PER_ITEM = 2048
FIELD_BYTES_BASE = 1 << 20


def _read_fields(folder: Path, n_items: int) -> ItemFields:
    if not (folder / artifact.ITEM_FIELDS).exists():
        return {}  # optional: data without an item table has none
    bound = FIELD_BYTES_BASE + FIELD_BYTES_PER_ITEM * n_items
    doc = artifact.read_typed(folder, artifact.ITEM_FIELDS, _ITEM_FIELDS, max_bytes=bound)
    artifact.check(set(doc) == {"fields"}, artifact.ITEM_FIELDS, 'expected one key, "fields"')
    fields = doc["fields"]
    artifact.check(len(fields) <= MAX_FIELDS, artifact.ITEM_FIELDS, f"{len(fields)} fields; at most {MAX_FIELDS}")
    bad = next((name for name in fields if not re.match(FIELD_NAME, name)), None)
    artifact.check(
        bad is None, artifact.ITEM_FIELDS, f"field name {bad!r} is not one a request can ask for ({FIELD_NAME})"
    )
    return fields


@dataclass
class RecQuery:
    user_id: str | None
    history: list[Step] = field(default_factory=list)  # oldest first, after the stored history
    k: int = 10
    exclude_seen: bool | None = None  # None: the model's default
    exclude_future: bool = True
    exclude_items: list[str] = field(default_factory=list)
    as_of: float | None = None
    fields: list[str] = field(default_factory=list)  # display fields to return with each item
    filter: object = None  # a business rule over the item fields (models/catalog.py), as the query sent it
    max_per: object = None  # at most N items per value of a field (models/catalog.py), as the query sent it
    # A user_id the version does not know, with no live events and no history given: "fallback" answers
    # from what users take now (or the catalog's popularity), "error" raises UnknownUserError.
    on_unknown: str = "fallback"


WARM_UP_USER = "\x00warm-up"  # a user no table holds: warm_up runs the fallback with it


@dataclass
class Prepared:
    """A query with its ids mapped: what the batcher carries to the model."""

    query: RecQuery
    history: list[int]  # known indices, oldest first
    exclude_seen: bool
    requested: list[int]
    unknown: list[str]
    reference: float | None  # in the release unit; None = no future exclusion
    extra: object = None  # task-specific tensors' inputs (e.g. actions and times)
    filter: Node | None = None  # the query's filter, checked against the model's fields
    spread: Spread | None = None  # the query's max_per, checked
    fallback: bool = False  # an unknown user: ranked by the fallback, not the model


@dataclass
class RecResult:
    user_id: str | None
    items: list[tuple[str, float]]
    unknown_items: list[str]
    excluded: dict[str, int]
    history_truncated: bool = False  # longer than the model reads: the most recent items were used
    fields: list[dict[str, FieldValue]] | None = None  # per item, when the query asked for fields
    floor: list[str] = field(default_factory=list)  # its reference list (models.ranking.Popular): never shown
    complete: bool = True  # k items: False when the exclusions, filter or max_per left fewer
    # Where the list came from: "model", or for a user it does not know the fallback's "popular_recent"
    # (what users took over the recent window) or "popular" (the artifact's most frequent).
    source: str = "model"


def check_query(q: RecQuery, position: int, *, fields: ItemFields, rules: CatalogRules) -> Node | None:
    """What the schema cannot know: k, the field names this model's artifact has, and the filter over
    them (-> the filter, parsed)."""
    if q.k < 1:
        raise QueryError("k must be at least 1", position=position, field=("k",))
    bad = unknown_field(q.fields, fields)
    if bad is not None:
        raise QueryError(bad[1], position=position, field=("fields", bad[0]))
    if q.filter is None:
        return None
    try:
        return rules.parse(q.filter)
    except FilterError as exc:
        raise QueryError(str(exc), position=position, field=("filter", *exc.path)) from None


def check_filter_work(prepared: Sequence[Prepared]) -> list[Prepared]:
    """A request's distinct filters hold at most MAX_REQUEST_FILTER_NODES conditions in all (each a pass over
    the catalog to compile): a QueryError at the first filter past it."""
    seen: set[Node] = set()
    total = 0
    for position, p in enumerate(prepared):
        if p.filter is None or p.filter in seen:
            continue
        seen.add(p.filter)
        total += filter_size(p.filter)
        if total > MAX_REQUEST_FILTER_NODES:
            raise QueryError(
                f"the request's distinct filters hold more than {MAX_REQUEST_FILTER_NODES} conditions in all",
                position=position,
                field=("filter",),
            )
    return list(prepared)


def check_spread(q: RecQuery, position: int, *, fields: ItemFields) -> Spread | None:
    if q.max_per is None:
        return None
    try:
        return parse_spread(q.max_per, fields=fields)
    except FilterError as exc:
        raise QueryError(str(exc), position=position, field=("max_per", *exc.path)) from None


def wanted_k(batch: Sequence[Prepared], size: int) -> int:
    """How many a batch's ranking pass returns per row: its largest k, widened for a row that spreads its list."""
    return min(size, max(p.query.k * (MAX_PER_POOL if p.spread else 1) for p in batch))


def unknown_user(
    q: RecQuery,
    position: int,
    *,
    requested: list[int],
    reference: float | None,
    rule: Node | None,
    spread: Spread | None = None,
) -> Prepared:
    """An unknown user's query with nothing to read: the fallback's (its own exclusions and filter kept),
    or UnknownUserError where the query asked for it."""
    if q.on_unknown == "error":
        raise UnknownUserError(q.user_id or "", position)
    return Prepared(
        query=q,
        history=[],
        exclude_seen=False,
        requested=requested,
        unknown=[],
        reference=reference,
        filter=rule,
        spread=spread,
        fallback=True,
    )


class UserQueryEngine(Engine[RecQuery, Prepared, RecResult], UserHistories[RecQuery, RecResult], Catalog):
    """An engine of the /recommend route: per-user live histories in the manifest's namespace."""

    live_events: int
    histories: HistoryTable  # the artifact's final histories (memory-mapped)
    entity_ids: IdMap  # what the model ranks, and what the table's steps index
    action_ids: IdMap | None = None  # what the table's actions index (the social model)

    @property
    def namespace(self) -> str:
        return self.manifest.namespace

    @property
    def live_budget(self) -> int:
        return self.live_events

    def users(self, queries: Sequence[RecQuery]) -> list[str]:
        return [q.user_id for q in queries if q.user_id is not None]

    def subject(self, query: RecQuery) -> str | None:
        return query.user_id

    def ranked(self, result: RecResult) -> list[str]:
        return [raw for raw, _ in result.items]

    def floor(self, result: RecResult) -> list[str]:
        return result.floor

    def source(self, result: RecResult) -> str:
        return result.source

    @cached_property
    def popular(self) -> Popular:
        """The reference lists' head (computed at load, by warm_up: a pass over the table's steps)."""
        return Popular.of(self.histories.by_count(len(self.entity_ids), FLOOR_HEAD), self.device)

    @cached_property
    def popular_scores(self) -> torch.Tensor:
        """(V,) float: how often each entity appears in the artifact's histories, specials at -inf: the
        fallback's ranking when no recent takes are counted (computed at load, by warm_up)."""
        counts = torch.from_numpy(self.histories.counts(len(self.entity_ids))).float()
        counts[:N_SPECIAL] = float("-inf")
        return counts.to(self.device)

    def future(self, batch: Sequence[Prepared]) -> torch.Tensor | None:
        """(B, V) bool: what is not released yet at each row's reference time; None: nothing to exclude."""
        return None

    def infer(self, batch: list[Prepared]) -> list[RecResult]:
        """The model's rows in one forward pass, an unknown user's rows ranked by the fallback (no model call)."""
        with torch.inference_mode():
            if not any(p.fallback for p in batch):
                return self.results(batch, self.spread(batch, self.run(batch)))
            own = [p for p in batch if not p.fallback]
            mine = iter(self.results(own, self.spread(own, self.run(own))) if own else [])
            others = [p for p in batch if p.fallback]
            ranked, source = self.fallback_ranked(others)
            theirs = iter([replace(r, source=source) for r in self.results(others, self.spread(others, ranked))])
            return [next(theirs) if p.fallback else next(mine) for p in batch]

    def spread(self, batch: list[Prepared], ranked: Ranked) -> Ranked:
        """The rows that asked for max_per, cut from their widened candidates to their k (models/catalog.py): the
        rows of one rule and k together."""
        groups: dict[tuple[Spread, int], list[int]] = {}
        for row, p in enumerate(batch):
            if p.spread:
                groups.setdefault((p.spread, p.query.k), []).append(row)
        for (rule, k), rows in groups.items():
            at = torch.tensor(rows, device=ranked.indices.device)
            i, s = self.rules.spread(ranked.indices[at], ranked.scores[at], rule, k)
            ranked.indices[at, :k], ranked.scores[at, :k] = i, s
            ranked.scores[at, k:] = float("-inf")
        return ranked

    def fallback_ranked(self, batch: list[Prepared]) -> tuple[Ranked, str]:
        """Rows ranked by what users take now (when enough was taken recently) or by the artifact's
        popularity, with their exclusions, filters and hidden items; -> the ranking and its source."""
        recent = self.rules.recent
        scores = recent if recent is not None else self.popular_scores
        out = rank_sparse(
            scores.expand(len(batch), -1),
            wanted_k(batch, len(self.entity_ids)),
            seen=None,
            future=self.future(batch),
            requested=index_rows([p.requested for p in batch], self.device),
            blocked=self.rules.blocked([p.filter for p in batch]),
            floor=self.popular,
        )
        return out, "popular" if recent is None else "popular_recent"

    def interleaved(self, first: RecResult, second: RecResult, picks: Sequence[tuple[int, int]]) -> RecResult:
        both = (first, second)
        items = [both[side].items[i] for side, i in picks]
        fields = None
        if first.fields is not None and second.fields is not None:
            fields = [both[side].fields[i] for side, i in picks]  # type: ignore[index]
        return replace(first, items=items, fields=fields)

    def stored_users(self) -> Iterator[str]:
        return self.histories.users()

    def has_history(self, user: str) -> bool:
        return self.histories.find(user) is not None

    @property
    def catalog_size(self) -> int:
        return len(self.entity_ids) - N_SPECIAL

    @cached_property
    def head_items(self) -> frozenset[str]:
        head = self.histories.most_frequent(HEAD_SHARE, len(self.entity_ids))
        return frozenset(r for i in head if (r := self.entity_ids.raw(i)) is not None)

    @cached_property
    def fresh_items(self) -> frozenset[str]:
        return frozenset(first_seen_live(self.manifest.config))

    def stored_timeline(self, user: str) -> Timeline:
        """The artifact's history of `user` with raw ids, oldest first (empty when it has none)."""
        return self.histories.timeline(user, self.entity_ids, self.action_ids)


class RecEngine(UserQueryEngine, ItemDisplay, Neighbours):
    """A recommendation artifact placed on a device, answering batches of queries."""

    def __init__(self, art: RecArtifact, options: EngineOptions) -> None:
        self.art = art
        self.manifest = art.manifest
        self.device = options.device
        self.live_events = options.live_events
        self.histories, self.entity_ids = art.histories, art.items
        self.model = (art.model.half() if options.half else art.model).to(self.device).eval()
        self.scores, self.scoring = serving_scores(self.model, self._examples, enabled=options.trace)
        self.rank: SeqRanker | None = None
        # Only float32 weights on the CPU (models/coarse.py); wide_ranker checks again on the table itself.
        cpu_f32 = self.device.type == "cpu" and not options.half
        wide = options.coarse_from is not None and self.catalog_size >= options.coarse_from
        if cpu_f32 and wide and self.model.dot_form() is not None:
            query, how = serving_scores(self.model, self._examples, enabled=options.trace, method="query")
            self.rank, ranking = wide_ranker(self.model, query, self._examples()[0])
            if self.rank is not None:
                self.scoring = f"{how} query, {ranking}"
        self.release = release_tensor(art.items.raws(), art.release).to(self.device) if art.release_unit else None
        self.rules = CatalogRules(art.items, art.fields, self.device)

    @property
    def catalog_size(self) -> int:
        return self.art.items.n_entities

    @property
    def item_fields(self) -> list[str]:
        return sorted(self.art.fields)

    def describe(self, raw_ids: Sequence[str], fields: Sequence[str]) -> list[dict[str, FieldValue]]:
        return describe(raw_ids, fields, self.art.fields)

    @property
    def similar_source(self) -> str:
        return "embedding" if self.art.similar is None else self.art.similar_source

    def similar(self, query: SimilarQuery) -> SimilarResult:
        at = self.art.items.index(query.item_id)
        if at < N_SPECIAL:
            raise UnknownItemError(query.item_id)
        bad = unknown_field(query.fields, self.art.fields)
        if bad is not None:
            raise ItemQueryError(bad[1], position=0, field=("fields", bad[0]))
        rule = None
        if query.filter is not None:
            try:
                rule = self.rules.parse(query.filter)
            except FilterError as exc:
                raise ItemQueryError(str(exc), position=0, field=("filter", *exc.path)) from None
        with torch.inference_mode():
            row = torch.tensor([at], device=self.device)
            if self.art.similar is None:
                form = self.model.dot_form()
                assert form is not None  # both recommenders rank in a dot form
                scores = cosine_scores(form.table, row)
            else:
                rows, counts = rows_of(*self.art.similar, [at])
                scores = table_scores(rows.to(self.device), counts.to(self.device), len(self.art.items))
            requested = [x for x in self.art.items.indices(query.exclude_items) if x >= N_SPECIAL]
            out = rank_sparse(
                scores,
                query.k,
                seen=None,
                future=None,
                requested=index_rows([requested], self.device),
                blocked=self.rules.blocked([rule]),
            )
        idx, values = out.indices[0].tolist(), out.scores[0].float().tolist()
        items = [(str(self.art.items.raw(i)), s) for i, s in zip(idx, values, strict=True) if s != -math.inf]
        excluded = {
            "requested": int(out.n_requested[0]),
            "filtered": int(out.n_blocked[0]) if out.n_blocked is not None else 0,
        }
        fields = describe([i for i, _ in items], query.fields, self.art.fields) if query.fields else None
        return SimilarResult(query.item_id, self.similar_source, items, excluded, fields)

    def _stored(self, user: str) -> tuple[list[int], float | None, tuple[int, int]] | None:
        """A user's stored items the model knows, the newest stored time and where its steps lie (read
        from the mapped table)."""
        table = self.art.histories
        found = table.span(user)
        if found is None:
            return None
        return table.known_items(*found, len(self.art.items)), table.newest_time(*found), found

    def _unheld(self, live: Timeline, newest: float, span: tuple[int, int]) -> Timeline:
        """The live steps the table does not hold: newer than its newest step, or at that same time and
        not among its steps of that time (ml-100k rates several items in one second). A candidate trained
        on live events still reads them from the store (it does not drop them); a step without a time is kept."""
        out, at_newest = [], None
        for step in live:
            t = step[1]
            if t < newest:
                continue
            if t == newest:
                if at_newest is None:
                    at_newest = self.art.histories.items_at(*span, newest)
                if self.art.items.index(step[0]) in at_newest:
                    continue
            out.append(step)
        return out

    def known(self, raw_ids: Sequence[str]) -> list[bool]:
        return [x >= N_SPECIAL for x in self.art.items.indices(raw_ids)]

    def prepare(self, queries: Sequence[RecQuery], live: Mapping[str, Timeline]) -> list[Prepared]:
        """Map raw ids to indices; raises UnknownUserError naming the query. Cheap: no model call."""
        return check_filter_work(
            [self._prepare(q, n, live.get(q.user_id, []) if q.user_id else []) for n, q in enumerate(queries)]
        )

    def _reference(self, q: RecQuery, when: float | None) -> float | None:
        """The row's reference time in the release unit, from `when` (the query's as_of wins); None: no
        future exclusion."""
        if not q.exclude_future or not self.art.release_unit:
            return None
        when = q.as_of if q.as_of is not None else when
        return reference_value(when, self.art.release_unit) if when is not None else None

    def _prepare(self, q: RecQuery, position: int, live: Timeline) -> Prepared:
        rule = check_query(q, position, fields=self.art.fields, rules=self.rules)
        spread = check_spread(q, position, fields=self.art.fields)
        requested = [x for x in self.art.items.indices(q.exclude_items) if x >= N_SPECIAL]
        stored: tuple[list[int], float | None, tuple[int, int]] = ([], None, (0, 0))
        if q.user_id is not None:
            found = self._stored(q.user_id)
            if found is None and not q.history and not live:
                # Nothing to read: a visitor is released-for as of now.
                when = self._reference(q, time.time())
                return unknown_user(q, position, requested=requested, reference=when, rule=rule, spread=spread)
            stored = found or stored
        if live and stored[1] is not None:
            live = self._unheld(live, stored[1], stored[2])
        events = [(i, optional_time(t)) for i, t, _ in live] + [(i, t) for i, t, _ in q.history]
        given = self.art.items.indices([i for i, _ in events])
        # Only the query's own ids: stored and live steps are never echoed (docs/decisions/private-histories.md).
        unknown = [i for (i, _, _), x in zip(q.history, given[len(live) :], strict=True) if x < N_SPECIAL]
        times = [t for _, t in events if t is not None] + ([stored[1]] if stored[1] is not None else [])
        return Prepared(
            query=q,
            history=stored[0] + [x for x in given if x >= N_SPECIAL],
            exclude_seen=self.exclude_seen_default if q.exclude_seen is None else q.exclude_seen,
            requested=requested,
            unknown=list(dict.fromkeys(unknown)),
            reference=self._reference(q, max(times) if times else None),
            filter=rule,
            spread=spread,
        )

    def future(self, batch: Sequence[Prepared]) -> torch.Tensor | None:
        if self.release is None or all(p.reference is None for p in batch):
            return None
        ref = torch.tensor([math.inf if p.reference is None else p.reference for p in batch], device=self.device)
        return future_mask(self.release, ref)

    def _examples(self) -> list[torch.Tensor]:
        rows = example_rows(N_SPECIAL, N_SPECIAL + self.art.items.n_entities, max_len=self.model.max_history)
        return [pack_histories(r, self.model.max_history).to(self.device) for r in rows]

    def run(self, batch: list[Prepared]) -> Ranked:
        """All prepared queries go through one forward pass."""
        return recommend(
            self.model,
            [p.history for p in batch],
            k=wanted_k(batch, len(self.art.items)),
            exclude_seen=[p.exclude_seen for p in batch],
            requested=[p.requested for p in batch],
            release=self.release,
            reference=[p.reference for p in batch],
            device=self.device,
            scores=self.scores,
            rank=self.rank,
            floor=self.popular,
            blocked=self.rules.blocked([p.filter for p in batch]),
        )

    def results(self, batch: list[Prepared], output: Ranked) -> list[RecResult]:
        return ranked_results(
            batch, output, raw=self.art.items.raw, max_history=self.model.max_history, fields=self.art.fields
        )

    def warm_up(self) -> None:
        self.rules.index_fields()
        # A history, and a visitor the table does not hold (the fallback's counts are taken at load too).
        self.answer([RecQuery(None, [(self.art.items.raw(N_SPECIAL) or "", None, None)], k=1), RecQuery(WARM_UP_USER)])


def ranked_results(
    batch: list[Prepared],
    output: Ranked,
    *,
    raw: Callable[[int], str | None],
    max_history: int,
    fields: ItemFields | None = None,
) -> list[RecResult]:
    """Ranked indices and counts -> raw ids and scores per query (a query's own k of the batch's top-k)."""
    idx = output.indices.cpu().tolist()
    scores = output.scores.float().cpu().tolist()
    blocked = output.n_blocked if output.n_blocked is not None else torch.zeros_like(output.n_seen)
    counts = torch.stack([output.n_seen, output.n_future, output.n_requested, blocked], 1).cpu().tolist()
    floors = output.floor.cpu().tolist() if output.floor is not None else [[] for _ in batch]
    out = []
    for row, p in enumerate(batch):
        kq = p.query.k
        items = [(str(raw(i)), s) for i, s in zip(idx[row][:kq], scores[row][:kq], strict=True) if s != -math.inf]
        seen, fut, req, rules = counts[row]
        asked = p.query.fields
        out.append(
            RecResult(
                p.query.user_id,
                items,
                p.unknown,
                {"seen": seen, "future": fut, "requested": req, "filtered": rules},
                len(p.history) > max_history,
                fields=describe([i for i, _ in items], asked, fields or {}) if asked else None,
                complete=len(items) == kq,
                floor=[r for i in floors[row] if i != PAD and (r := raw(i)) is not None],
            )
        )
    return out


def describe(raw_ids: Sequence[str], asked: Sequence[str], fields: ItemFields) -> list[dict[str, FieldValue]]:
    """The asked fields of each item; an item without a value for a field leaves it out."""
    return [{name: fields[name][i] for name in asked if i in fields[name]} for i in raw_ids]
