"""A catalog's business rules over one engine's entities, as masks the ranking pass applies
(models.ranking.exclude's `blocked`): the items hidden by an admin call, each query's filter over the
item fields the artifact holds, and what users take now, which ranks the fallback for a visitor the
model does not know. Pure tensor work per request: a filter is compiled once into a (V,) mask and kept
(bounded by bytes); nothing loops over items or users per request (docs/decisions/catalog-rules.md).

A filter, as a query carries it (JSON):
  {"field": "genres", "any_of": ["Comedy", "Drama"]}   keep items with one of these values (a list
                                                       field: one of its values among them)
  {"field": "brand", "none_of": ["X"]}                 keep items with none of them (no value: kept)
  {"field": "year", "between": [1990, null]}           keep items whose number lies in [low, high]
  {"field": "item_id", "none_of": ["42"]}              the ids themselves
  {"all": [f, ...]}  {"any": [f, ...]}  {"not": f}     composed
  {"name": "genre", "params": {"genres": ["Comedy"]}}  a named filter (stored by an admin call), each
                                                       {"param": p} in it replaced by params[p]
A query may also spread its list (`max_per`, e.g. {"genres": 3}): after scoring, an item is kept when, for
each of its values of the field, fewer than N better-scored candidates hold that value; MAX_PER_POOL times
k candidates are ranked for it, so a list may come back shorter than k.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models.ids import N_SPECIAL, IdMap

FieldValue = str | float | list[str]
ItemFields = dict[str, dict[str, FieldValue]]  # field name -> raw item id -> value
FieldKinds = Mapping[str, bool]  # field name -> whether it holds numbers (else text), read once at load

MAX_FILTER_DEPTH = 6  # nesting of all / any / not
MAX_FILTER_NODES = 64  # conditions and compositions in one filter
MAX_FILTER_VALUES = 1000  # values over every condition of one filter
MAX_VALUE_CHARS = 256  # a text value, as an id
MAX_FILTER_BYTES = 32 << 10  # a filter's canonical JSON (its values, quoted, and its structure)
# Conditions and compositions over a request's distinct filters: each costs a pass over the catalog's
# entries when it compiles (vectorised, on the model's thread), so a request's compile work is bounded by
# this many passes (docs/decisions/catalog-rules.md).
MAX_REQUEST_FILTER_NODES = 4 * MAX_FILTER_NODES
FILTER_CACHE_BYTES = 64 << 20  # compiled masks kept per engine, their keys and entries counted
CACHE_ENTRY_BYTES = 1024  # an entry's own cost past its mask: key digest, tensor object, dict slot
ITEM_ID = "item_id"  # the filter field naming the entities' own ids
OPS = ("any_of", "none_of", "between")
MAX_PER_POOL = 5  # candidates ranked per asked item where a query spreads its list (max_per)
MAX_PER_FIELDS = 4
MAX_PER_COUNT = 1000  # at most this many per value: no list is longer
Spread = tuple[tuple[str, int], ...]  # (field, at most this many items per value), checked


class FilterError(ValueError):
    """A filter that does not parse or does not fit the model's fields: `path` is where, inside it."""

    def __init__(self, message: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class Condition:
    field: str
    op: str  # one of OPS
    values: tuple[str | float | None, ...]


@dataclass(frozen=True)
class Composed:
    op: str  # "all", "any", "not"
    parts: tuple[Node, ...]


Node = Condition | Composed


def field_kinds(fields: ItemFields) -> dict[str, bool]:
    """Each field's kind (numbers or text): one pass over its values, when a version loads, so that parsing
    a filter only looks names up in this table."""
    return {name: _is_numeric(column) for name, column in fields.items()}


def parse_filter(raw: object, *, kinds: FieldKinds, named: Mapping[str, object] | None = None) -> Node:
    """A filter checked against the fields a model holds (ITEM_ID always): FilterError names the place.
    `named`: the model's named filters (name -> expression with {"param": p} placeholders). Its cost is
    bounded by the filter's size, never by the catalog's."""
    if isinstance(raw, dict) and "name" in raw:
        raw = _resolve(raw, named or {})
    counts = [0, 0]  # nodes, values
    node = _parse(raw, kinds, (), counts)
    if len(canonical(node)) > MAX_FILTER_BYTES:
        raise FilterError(f"a filter of more than {MAX_FILTER_BYTES} bytes (as JSON, without spaces)")
    return node


def size(node: Node) -> int:
    """A filter's conditions and compositions: the passes over the catalog compiling it takes."""
    return 1 if isinstance(node, Condition) else 1 + sum(size(p) for p in node.parts)


def _resolve(raw: Mapping[str, object], named: Mapping[str, object]) -> object:
    """A named filter's expression with the request's parameters put in."""
    extra = sorted(set(raw) - {"name", "params"})
    if extra:
        raise FilterError(f"a named filter takes 'name' and 'params', not {extra}", (extra[0],))
    name, params = raw.get("name"), raw.get("params", {})
    if not isinstance(name, str) or name not in named:
        raise FilterError(f"no filter named {name!r}; this model has {sorted(named)}", ("name",))
    if not isinstance(params, dict):
        raise FilterError("'params' is an object: parameter -> value", ("params",))
    used: set[str] = set()

    def put(node: object) -> object:
        if isinstance(node, dict) and set(node) == {"param"}:
            p = node["param"]
            if not isinstance(p, str) or p not in params:
                raise FilterError(f"filter {name!r} needs parameter {p!r}", ("params", str(p)))
            used.add(p)
            return params[p]
        if isinstance(node, dict):
            return {k: put(v) for k, v in node.items()}
        if isinstance(node, list):
            return [put(v) for v in node]
        return node

    out = put(named[name])
    unused = sorted(set(params) - used)
    if unused:
        raise FilterError(f"filter {name!r} has no parameter {unused[0]!r}", ("params", unused[0]))
    return out


def _parse(raw: object, kinds: FieldKinds, path: tuple[str | int, ...], counts: list[int]) -> Node:
    counts[0] += 1
    if counts[0] > MAX_FILTER_NODES:
        raise FilterError(f"more than {MAX_FILTER_NODES} conditions", path)
    if len([p for p in path if isinstance(p, str) and p in ("all", "any", "not")]) > MAX_FILTER_DEPTH:
        raise FilterError(f"nested deeper than {MAX_FILTER_DEPTH}", path)
    if not isinstance(raw, dict) or not raw:
        raise FilterError("a filter is an object: a condition, or all / any / not", path)
    composed = [k for k in ("all", "any", "not") if k in raw]
    if composed:
        if len(raw) != 1:
            raise FilterError(f"{composed[0]!r} stands alone in its object", path)
        op = composed[0]
        if op == "not":
            return Composed("not", (_parse(raw["not"], kinds, (*path, "not"), counts),))
        parts = raw[op]
        if not isinstance(parts, list) or not parts:
            raise FilterError(f"{op!r} takes a non-empty list of filters", (*path, op))
        return Composed(op, tuple(_parse(p, kinds, (*path, op, n), counts) for n, p in enumerate(parts)))
    name = raw.get("field")
    if not isinstance(name, str):
        raise FilterError("a condition names its 'field'", (*path, "field"))
    if name != ITEM_ID and name not in kinds:
        has = sorted([ITEM_ID, *kinds])
        raise FilterError(f"unknown field {name!r}; this model has {has}", (*path, "field"))
    ops = [k for k in raw if k != "field"]
    if len(ops) != 1 or ops[0] not in OPS:
        raise FilterError(f"a condition has 'field' and one of {list(OPS)}", path)
    op = ops[0]
    values = raw[op]
    where = (*path, op)
    if not isinstance(values, list):
        raise FilterError(f"{op!r} takes a list", where)
    counts[1] += len(values)
    if counts[1] > MAX_FILTER_VALUES:
        raise FilterError(f"more than {MAX_FILTER_VALUES} values in one filter", where)
    numeric = name != ITEM_ID and kinds[name]
    if op == "between":
        if name == ITEM_ID or not numeric:
            raise FilterError(f"field {name!r} holds text: 'between' needs a number field", where)
        ok = len(values) == 2 and all(v is None or _number(v) for v in values) and values != [None, None]
        if not ok:
            raise FilterError("'between' takes [low, high]: numbers, one of them may be null", where)
        return Condition(name, op, (values[0], values[1]))
    if not values:
        raise FilterError(f"{op!r} takes at least one value", where)
    for n, v in enumerate(values):
        if numeric and not _number(v):
            raise FilterError(f"field {name!r} holds numbers: {v!r} is not one", (*where, n))
        if not numeric and not isinstance(v, str):
            raise FilterError(f"field {name!r} holds text: {v!r} is not a string", (*where, n))
        if not numeric and len(v) > MAX_VALUE_CHARS:
            raise FilterError(f"a value of more than {MAX_VALUE_CHARS} characters", (*where, n))
    return Condition(name, op, tuple(values))


def parse_spread(raw: object, *, fields: Mapping[str, Mapping[str, FieldValue]]) -> Spread:
    """A query's max_per checked against the model's fields: FilterError names the place."""
    if not isinstance(raw, dict) or not raw or len(raw) > MAX_PER_FIELDS:
        raise FilterError(f"max_per maps 1 to {MAX_PER_FIELDS} fields to a count")
    out = []
    for name, n in raw.items():
        if name not in fields:
            raise FilterError(f"unknown field {name!r}; this model has {sorted(fields)}", (name,))
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PER_COUNT:
            raise FilterError(f"a count from 1 to {MAX_PER_COUNT}", (name,))
        out.append((name, n))
    return tuple(out)


def _number(v: object) -> bool:
    """A finite JSON number that a float holds (an integer of 400 digits is not one)."""
    if not isinstance(v, int | float) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _is_numeric(column: Mapping[str, FieldValue]) -> bool:
    """A field is numeric when every value it holds is a number."""
    return bool(column) and all(_number(v) for v in column.values())


def canonical(node: Node) -> str:
    """The filter's key: equal filters, equal keys (the cache's)."""
    return json.dumps(_plain(node), sort_keys=True, separators=(",", ":"))


def _plain(node: Node) -> object:
    if isinstance(node, Condition):
        return [node.field, node.op, list(node.values)]
    return [node.op, [_plain(p) for p in node.parts]]


class CatalogRules:
    """One engine's rules over its V entities (indices of `ids`; N_SPECIAL first slots never ranked)."""

    def __init__(
        self,
        ids: IdMap,
        fields: ItemFields,
        device: torch.device,
        *,
        cache_bytes: int = FILTER_CACHE_BYTES,
    ) -> None:
        self.ids, self.fields, self.device = ids, fields, device
        self.kinds = field_kinds(fields)
        self.size = len(ids)
        self.hidden: torch.Tensor | None = None  # (V,) bool, None: nothing hidden
        self.hidden_ids: frozenset[str] = frozenset()
        self.taken_now: torch.Tensor | None = None  # (V,) float32: what users took over the recent window
        self.taken_now_total = 0.0
        self.min_takes = 20.0  # fewer recent takes than this: the fallback ranks by the artifact's popularity
        self.cache_bytes = cache_bytes
        self.named: dict[str, object] = {}  # the model's named filters (set by the service, as hidden items)
        self._masks: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # filter key's digest -> (V,) bool, blocked
        self._columns: dict[str, object] = {}  # field -> its compiled column (value index or numbers)

    # --- hidden items: what the service keeps in the production state, set here each housekeeping tick

    def hide(self, raw_ids: Iterable[str]) -> bool:
        """Hide exactly these ids (raw; those the model does not know are kept aside); -> whether it changed."""
        wanted = frozenset(raw_ids)
        if wanted == self.hidden_ids:
            return False
        idx = [i for i in self.ids.indices(sorted(wanted)) if i >= N_SPECIAL]
        mask = None
        if idx:
            mask = torch.zeros(self.size, dtype=torch.bool)
            mask[torch.tensor(idx, dtype=torch.long)] = True
            mask = mask.to(self.device)
        self.hidden, self.hidden_ids = mask, wanted  # one reference each: a request reads one or the other
        return True

    # --- what users take now: counted by the service from the store's arrivals

    def take_counts(self, counts: Mapping[str, float], *, min_takes: float | None = None) -> None:
        """What users took over the recent window, per raw id (ids the model does not know count nowhere)."""
        if min_takes is not None:
            self.min_takes = min_takes
        raws = list(counts)
        idx = self.ids.indices(raws)
        keep = [(i, counts[r]) for i, r in zip(idx, raws, strict=True) if i >= N_SPECIAL]
        if not keep:
            self.taken_now, self.taken_now_total = None, 0.0
            return
        vec = torch.zeros(self.size, dtype=torch.float32)
        at = torch.tensor([i for i, _ in keep], dtype=torch.long)
        vec[at] = torch.tensor([c for _, c in keep], dtype=torch.float32)
        vec[:N_SPECIAL] = float("-inf")
        self.taken_now, self.taken_now_total = vec.to(self.device), float(sum(c for _, c in keep))

    # --- filters

    def index_fields(self) -> None:
        """Build every field's filter index now (at load, in the loading thread): a request's first filter on a
        large catalog then compiles in milliseconds instead of building the index on the model's thread."""
        for name, numeric in self.kinds.items():
            if numeric:
                self._sorted(name)
            else:
                self._value_index(name)

    @property
    def recent(self) -> torch.Tensor | None:
        """The recent takes when there are enough of them to rank by, else None."""
        return self.taken_now if self.taken_now_total >= self.min_takes else None

    def parse(self, raw: object) -> Node:
        return parse_filter(raw, kinds=self.kinds, named=self.named)

    def blocked(self, filters: Sequence[Node | None]) -> torch.Tensor | None:
        """What a batch's rules take out: None (nothing), (V,) (hidden items alone, every row alike) or
        (B, V) bool (rows with a filter)."""
        hidden = self.hidden
        if all(f is None for f in filters):
            return hidden
        rows = [self.mask(f) if f is not None else None for f in filters]
        none = hidden if hidden is not None else torch.zeros(self.size, dtype=torch.bool, device=self.device)
        stacked = torch.stack([r if r is not None else none for r in rows])
        return stacked | hidden if hidden is not None else stacked

    def mask(self, node: Node) -> torch.Tensor:
        """The (V,) bool mask of the items `node` takes out, compiled once and kept (least recently used first
        out, within cache_bytes: masks, keys and entries counted)."""
        key = hashlib.blake2b(canonical(node).encode(), digest_size=16).digest()
        found = self._masks.get(key)
        if found is not None:
            self._masks.move_to_end(key)
            return found
        keep = torch.from_numpy(self._keep(node))
        blocked = (~keep).to(self.device)
        self._masks[key] = blocked
        while self.cached_bytes > self.cache_bytes and len(self._masks) > 1:
            self._masks.popitem(last=False)
        return blocked

    def spread(
        self, indices: torch.Tensor, scores: torch.Tensor, rule: Spread, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of candidates (R, M), best first, cut to the first k each that `rule` keeps (-inf past a row's
        end): an item is kept when, for each of its values, fewer than N better-scored candidates of its row
        hold that value. Every row at once: a sort of (row, value, position) keys gives each candidate's count
        of better ones sharing each of its values."""
        rows, m = indices.shape
        keep = torch.isfinite(scores)
        for name, n in rule:
            table = self._value_ids(name).to(indices.device)
            vals = table[indices]  # (R, M, L), -1 past an item's values
            width, n_values = vals.size(2), int(table.max()) + 2
            has = vals >= 0
            pos = torch.arange(m, device=vals.device)[None, :, None]
            row = torch.arange(rows, device=vals.device)[:, None, None]
            group = row * n_values + vals + 1  # (row, value) as one number, 0 for "no value"
            key = torch.where(has, group * m + pos, -1).reshape(-1)
            order = key.argsort()
            ordered = key[order]
            grouped = torch.where(ordered >= 0, ordered // m, -1)
            start = torch.ones_like(grouped, dtype=torch.bool)
            start[1:] = grouped[1:] != grouped[:-1]
            at = torch.arange(len(order), device=vals.device)
            first = torch.cummax(torch.where(start, at, 0), 0).values
            rank = torch.empty_like(order)
            rank[order] = at - first  # better candidates of the same row holding the same value
            keep &= ((rank.reshape(rows, m, width) < n) | ~has).all(2)
        # The kept candidates first, in their order; then the others, never shown.
        order = torch.argsort((~keep).to(torch.int64) * m + torch.arange(m, device=keep.device), dim=1)[:, :k]
        out_i = indices.gather(1, order)
        out_s = scores.gather(1, order).masked_fill(~keep.gather(1, order), float("-inf"))
        return out_i, out_s

    @property
    def cached_bytes(self) -> int:
        return len(self._masks) * (self.size + CACHE_ENTRY_BYTES)

    def _keep(self, node: Node) -> np.ndarray:
        """(V,) bool: the entities the filter keeps."""
        if isinstance(node, Composed):
            parts = [self._keep(p) for p in node.parts]
            if node.op == "not":
                return ~parts[0]
            out = parts[0].copy()
            for p in parts[1:]:
                out = (out & p) if node.op == "all" else (out | p)
            return out
        if node.op == "between":
            low, high = (None if v is None else float(v) for v in node.values)
            _, values = self._sorted(node.field)
            lo = 0 if low is None else int(np.searchsorted(values, low, "left"))
            hi = len(values) if high is None else int(np.searchsorted(values, high, "right"))
            return self._holding(node.field, [(lo, hi)], low, high)
        hit = np.zeros(self.size, dtype=bool)
        if node.field == ITEM_ID:
            idx = [i for i in self.ids.indices([str(v) for v in node.values]) if i >= N_SPECIAL]
            hit[idx] = True
        elif self.kinds[node.field]:
            _, values = self._sorted(node.field)
            wanted = np.unique(np.array([float(v) for v in node.values if v is not None]))
            starts = np.searchsorted(values, wanted, "left").tolist()
            ends = np.searchsorted(values, wanted, "right").tolist()
            spans = [(a, b) for a, b in zip(starts, ends, strict=True) if b > a]
            hit = self._holding(node.field, spans, wanted=wanted)
        else:
            index = self._value_index(node.field)
            for v in node.values:
                at = index.get(str(v))
                if at is not None:
                    hit[at] = True
        return hit if node.op == "any_of" else ~hit

    def _holding(
        self,
        name: str,
        spans: list[tuple[int, int]],
        low: float | None = None,
        high: float | None = None,
        *,
        wanted: np.ndarray | None = None,
    ) -> np.ndarray:
        """(V,) bool: the entities whose value of a number field lies in these spans of its sorted values.
        Few of them: set from the sorted order, at a cost bounded by the values and the items they hold; many:
        one vectorised comparison over the column, which is then cheaper than scattering."""
        order, _ = self._sorted(name)
        hits = sum(b - a for a, b in spans)
        if hits * 4 <= self.size:
            keep = np.zeros(self.size, dtype=bool)
            for a, b in spans:
                keep[order[a:b]] = True
            return keep
        values = self._numbers(name)
        if wanted is not None:
            return np.isin(values, wanted)
        keep = ~np.isnan(values)
        if low is not None:
            keep &= values >= float(low)
        if high is not None:
            keep &= values <= float(high)
        return keep

    def _sorted(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A number field's entities in the order of their values, and those values (no NaN), ascending."""
        key = f"<{name}"
        col = self._columns.get(key)
        if col is None:
            values = self._numbers(name)
            order = np.argsort(values, kind="stable")  # NaN last
            order = order[: int((~np.isnan(values)).sum())]
            self._columns[key] = col = (order.astype(np.int32 if self.size < 2**31 else np.int64), values[order])
        assert isinstance(col, tuple)
        return col

    def _numbers(self, name: str) -> np.ndarray:
        """(V,) float64 of a numeric field, NaN where an entity has no value."""
        col = self._columns.get(name)
        if col is None:
            column = self.fields[name]
            raws = list(column)
            out = np.full(self.size, np.nan)
            idx = np.array(self.ids.indices(raws), dtype=np.int64)
            vals = np.array([float(column[r]) for r in raws], dtype=np.float64)  # type: ignore[arg-type]
            ok = idx >= N_SPECIAL
            out[idx[ok]] = vals[ok]
            self._columns[name] = col = out
        assert isinstance(col, np.ndarray)
        return col

    def _value_ids(self, name: str) -> torch.Tensor:
        """(V, L) long: each entity's values of a field as ids (numbers and text alike), -1 past its last."""
        key = f"#{name}"
        col = self._columns.get(key)
        if col is None:
            column, ids = self.fields[name], dict[str, int]()
            lists = {
                r: [ids.setdefault(str(v), len(ids)) for v in (value if isinstance(value, list) else [value])]
                for r, value in column.items()
            }
            width = max([1, *(len(v) for v in lists.values())])
            out = torch.full((self.size, width), -1, dtype=torch.long)
            for i, r in zip(self.ids.indices(list(lists)), lists, strict=True):
                if i >= N_SPECIAL and lists[r]:
                    out[i, : len(lists[r])] = torch.tensor(lists[r])
            self._columns[key] = col = out
        assert isinstance(col, torch.Tensor)
        return col

    def _value_index(self, name: str) -> dict[str, np.ndarray]:
        """A text field's inverted index: value -> the entities holding it (a list field: any of its values)."""
        col = self._columns.get(name)
        if col is None:
            by_value: dict[str, list[int]] = {}
            column = self.fields[name]
            raws = list(column)
            for i, r in zip(self.ids.indices(raws), raws, strict=True):
                if i < N_SPECIAL:
                    continue
                value = column[r]
                for v in value if isinstance(value, list) else [value]:
                    by_value.setdefault(str(v), []).append(i)
            col = {v: np.array(ix, dtype=np.int64) for v, ix in by_value.items()}
            self._columns[name] = col
        assert isinstance(col, dict)
        return col
