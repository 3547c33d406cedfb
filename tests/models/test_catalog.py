"""Catalog rules: each filter operator against a hand computation, the checks that name the place of a
bad filter, the cache's bound, hidden items and recent takes as the masks the ranking pass reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.catalog import (
    CACHE_ENTRY_BYTES,
    MAX_FILTER_BYTES,
    CatalogRules,
    FilterError,
    canonical,
    field_kinds,
    parse_filter,
    parse_spread,
)
from models.ids import N_SPECIAL, IdMap
from models.ranking import rank_sparse

IDS = IdMap(["a", "b", "c", "d", "e"])  # indices 2..6
FIELDS = {
    "genres": {"a": ["X", "Y"], "b": ["Y"], "c": ["Z"], "d": []},  # e: no value
    "year": {"a": 1990, "b": 1995.0, "c": 2000, "e": 1985},  # d: no value
    "brand": {"a": "acme", "b": "other", "c": "acme", "d": "none"},
}


def kept(rules: CatalogRules, raw: object) -> set[str]:
    """The raw ids a filter keeps (its mask's False entries, specials aside)."""
    blocked = rules.mask(rules.parse(raw))
    return {IDS.raw(i) or "" for i in range(N_SPECIAL, len(IDS)) if not blocked[i]}


@pytest.fixture
def rules() -> CatalogRules:
    return CatalogRules(IDS, FIELDS, torch.device("cpu"))


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ({"field": "genres", "any_of": ["Y"]}, {"a", "b"}),  # a list field: one of its values
        ({"field": "genres", "any_of": ["X", "Z"]}, {"a", "c"}),
        ({"field": "genres", "none_of": ["Y"]}, {"c", "d", "e"}),  # no value: kept by none_of
        ({"field": "brand", "any_of": ["acme"]}, {"a", "c"}),
        ({"field": "year", "between": [1990, 1995]}, {"a", "b"}),  # bounds included
        ({"field": "year", "between": [1995, None]}, {"b", "c"}),
        ({"field": "year", "between": [None, 1989]}, {"e"}),  # no value: never between
        ({"field": "year", "any_of": [2000]}, {"c"}),
        ({"field": "item_id", "none_of": ["a", "zz"]}, {"b", "c", "d", "e"}),  # an unknown id changes nothing
        ({"not": {"field": "brand", "any_of": ["acme"]}}, {"b", "d", "e"}),
        ({"all": [{"field": "genres", "any_of": ["Y", "Z"]}, {"field": "year", "between": [1991, None]}]}, {"b", "c"}),
        ({"any": [{"field": "item_id", "any_of": ["e"]}, {"field": "genres", "any_of": ["Z"]}]}, {"c", "e"}),
    ],
)
def test_each_operator_keeps_what_a_hand_computation_keeps(rules: CatalogRules, raw: object, want: set[str]) -> None:
    assert kept(rules, raw) == want


@pytest.mark.parametrize(
    ("raw", "path", "says"),
    [
        ({"field": "colour", "any_of": ["x"]}, ("field",), "unknown field 'colour'"),
        ({"field": "genres", "between": [1, 2]}, ("between",), "holds text"),
        ({"field": "year", "any_of": ["1990"]}, ("any_of", 0), "holds numbers"),
        ({"field": "brand", "any_of": [3]}, ("any_of", 0), "holds text"),
        ({"field": "year", "between": [None, None]}, ("between",), "[low, high]"),
        ({"field": "year", "between": [10**400, None]}, ("between",), "[low, high]"),  # no float holds it
        ({"field": "year", "any_of": [10**400]}, ("any_of", 0), "holds numbers"),
        ({"all": [{"field": "brand"}]}, ("all", 0), "one of"),
        ({"all": []}, ("all",), "non-empty"),
        ({"not": {"field": "brand", "any_of": ["acme"]}, "all": []}, (), "stands alone"),
        ("genres", (), "an object"),
    ],
)
def test_a_bad_filter_says_where(raw: object, path: tuple[object, ...], says: str) -> None:
    with pytest.raises(FilterError, match=None) as got:
        parse_filter(raw, kinds=field_kinds(FIELDS))
    assert got.value.path == path and says in str(got.value)


def test_filters_are_bounded_in_size_and_depth() -> None:
    deep: object = {"field": "brand", "any_of": ["acme"]}
    for _ in range(7):
        deep = {"not": deep}
    with pytest.raises(FilterError, match="deeper"):
        parse_filter(deep, kinds=field_kinds(FIELDS))
    wide = {"any": [{"field": "brand", "any_of": ["acme"]}] * 65}
    with pytest.raises(FilterError, match="conditions"):
        parse_filter(wide, kinds=field_kinds(FIELDS))
    many = {"field": "item_id", "any_of": [str(i) for i in range(1001)]}
    with pytest.raises(FilterError, match="values"):
        parse_filter(many, kinds=field_kinds(FIELDS))


def test_equal_filters_share_one_compiled_mask_and_the_cache_keeps_its_bound(rules: CatalogRules) -> None:
    one = rules.parse({"field": "brand", "any_of": ["acme"]})
    assert canonical(one) == canonical(parse_filter({"any_of": ["acme"], "field": "brand"}, kinds=field_kinds(FIELDS)))
    assert rules.mask(one) is rules.mask(rules.parse({"any_of": ["acme"], "field": "brand"}))
    entry = len(IDS) + CACHE_ENTRY_BYTES  # a mask and what its key and slot hold
    small = CatalogRules(IDS, FIELDS, torch.device("cpu"), cache_bytes=2 * entry)
    for year in (1985, 1990, 1995, 2000):
        small.mask(small.parse({"field": "year", "any_of": [year]}))
    assert small.cached_bytes == 2 * entry  # the two most recent kept, keys counted


def test_a_long_value_or_a_large_filter_is_refused() -> None:
    kinds = field_kinds(FIELDS)
    with pytest.raises(FilterError, match="256 characters") as got:
        parse_filter({"field": "brand", "any_of": ["ok", "x" * 257]}, kinds=kinds)
    assert got.value.path == ("any_of", 1)
    parse_filter({"field": "brand", "any_of": ["x" * 256]}, kinds=kinds)
    big = {"field": "item_id", "any_of": [f"{n:0>200}" for n in range(200)]}  # 200 values of 200 characters
    with pytest.raises(FilterError, match=f"more than {MAX_FILTER_BYTES} bytes"):
        parse_filter(big, kinds=kinds)


class _Untouchable(dict[str, dict[str, object]]):
    """Item fields a filter must not read once the version has loaded."""

    def __getitem__(self, key: str) -> dict[str, object]:
        raise AssertionError(f"read the values of {key!r}")

    def values(self) -> object:
        raise AssertionError("read the values")

    def items(self) -> object:
        raise AssertionError("read the values")


def test_parsing_and_compiling_read_the_tables_built_at_load_not_the_items(rules: CatalogRules) -> None:
    """Parsing checks names and kinds in a small table; compiling reads the arrays built at load: neither
    walks the catalog's values (the cost a number filter had: a pass over every item per condition)."""
    rules.index_fields()
    rules.fields = _Untouchable()  # type: ignore[assignment]
    every = [
        {"field": "year", "between": [1990, None]},
        {"field": "year", "any_of": [2000, 1985]},
        {"field": "genres", "any_of": ["Y"]},
        {"field": "brand", "none_of": ["acme"]},
    ]
    assert kept(rules, {"any": every}) == {"a", "b", "c", "d", "e"}
    assert kept(rules, every[1]) == {"c", "e"}


def test_hidden_items_and_a_row_s_filter_come_out_of_the_ranking_and_are_counted(rules: CatalogRules) -> None:
    rules.hide(["b", "not-in-the-catalog"])
    rules_filter = rules.parse({"field": "brand", "any_of": ["acme"]})
    blocked = rules.blocked([None, rules_filter])
    assert blocked is not None and blocked.shape == (2, len(IDS))
    scores = torch.arange(len(IDS), dtype=torch.float).expand(2, -1).clone()
    scores[:, :N_SPECIAL] = float("-inf")
    out = rank_sparse(scores, 5, seen=None, future=None, requested=None, blocked=blocked)
    names = [
        [IDS.raw(int(i)) for i, s in zip(r, v, strict=True) if s > float("-inf")]
        for r, v in zip(out.indices, out.scores, strict=True)
    ]
    assert names == [["e", "d", "c", "a"], ["c", "a"]]  # b hidden everywhere; row 2 keeps acme alone
    assert out.n_blocked is not None and out.n_blocked.tolist() == [1, 3]
    assert rules.blocked([None, None]) is rules.hidden  # no filter: the hidden mask alone, shared by the rows
    assert rules.hide(["b", "not-in-the-catalog"]) is False  # unchanged: nothing rebuilt
    rules.hide([])
    assert rules.blocked([None]) is None  # nothing to apply: the ranking pass is the plain one


def test_recent_takes_rank_the_fallback_only_past_their_minimum(rules: CatalogRules) -> None:
    rules.take_counts({"c": 5, "a": 2, "unknown": 40}, min_takes=8)
    assert rules.recent is None  # 7 takes of known items: not enough
    rules.take_counts({"c": 6, "a": 2})
    assert rules.recent is not None
    assert rules.recent[IDS.index("c")] == 6 and rules.recent[IDS.index("b")] == 0
    assert rules.recent[0] == float("-inf")


def test_max_per_keeps_an_item_while_fewer_than_n_better_ones_share_a_value(rules: CatalogRules) -> None:
    """Candidates a, b, c, d, e best first: genres a [X, Y], b [Y], c [Z], d [], e (none). At most one per genre:
    a is kept (first X, first Y), b is not (a holds Y), c is (first Z), d and e hold no genre."""
    order = torch.tensor([[IDS.index(r) for r in "abcde"]])
    scores = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]])
    spread = parse_spread({"genres": 1}, fields=FIELDS)
    idx, got = rules.spread(order, scores, spread, 4)
    assert [IDS.raw(int(i)) for i in idx[0]] == ["a", "c", "d", "e"] and got[0].tolist() == [5.0, 3.0, 2.0, 1.0]
    idx, got = rules.spread(order, scores, parse_spread({"genres": 2}, fields=FIELDS), 3)
    assert [IDS.raw(int(i)) for i in idx[0]] == ["a", "b", "c"]
    both = parse_spread({"genres": 2, "brand": 1}, fields=FIELDS)  # brand: a acme, b other, c acme, d none
    idx, got = rules.spread(order, scores, both, 5)
    assert [IDS.raw(int(i)) for i, s in zip(idx[0], got[0], strict=True) if s > float("-inf")] == ["a", "b", "d", "e"]
    assert got[0, -1] == float("-inf")  # fewer than k kept: the row says so with -inf
    # Rows apart: the second row (c first) keeps its own first of each genre, never counting the first row's.
    two = torch.tensor([[IDS.index(r) for r in "abcde"], [IDS.index(r) for r in "cbaed"]])
    idx, _ = rules.spread(two, scores.expand(2, -1), spread, 3)
    assert [[IDS.raw(int(i)) for i in r] for r in idx] == [["a", "c", "d"], ["c", "b", "e"]]
    with pytest.raises(FilterError, match="unknown field"):
        parse_spread({"colour": 1}, fields=FIELDS)
    for n in (0, 10**30):  # a count no list can reach is refused, not turned into a 500
        with pytest.raises(FilterError, match="a count from 1"):
            parse_spread({"genres": n}, fields=FIELDS)


@pytest.mark.parametrize("seed", range(4))
def test_number_conditions_keep_what_a_pass_over_every_item_keeps(seed: int) -> None:
    """Narrow spans set from the sorted order, wide ones compared over the column: both keep exactly what a
    check of each item's value keeps (missing values never kept, bounds included, repeated values)."""
    rng = np.random.default_rng(seed)
    raw = [str(i) for i in range(300)]
    ids = IdMap(raw)
    years = {r: float(rng.integers(1950, 2000)) for r in raw if rng.random() < 0.9}
    rules = CatalogRules(ids, {"year": years}, torch.device("cpu"))  # type: ignore[arg-type]
    for _ in range(40):
        low, high = sorted(rng.integers(1945, 2005, size=2).tolist())
        low_or_none = None if rng.random() < 0.2 else low
        high_or_none = None if rng.random() < 0.2 and low_or_none is not None else high
        want = {
            r for r, y in years.items() if (low_or_none is None or y >= low) and (high_or_none is None or y <= high)
        }
        got = rules.mask(rules.parse({"field": "year", "between": [low_or_none, high_or_none]}))
        assert {r for r in raw if not got[ids.index(r)]} == want
        values = rng.integers(1945, 2005, size=int(rng.integers(1, 60))).tolist()
        want = {r for r, y in years.items() if y in values}
        got = rules.mask(rules.parse({"field": "year", "any_of": values}))
        assert {r for r in raw if not got[ids.index(r)]} == want
