"""The memory-mapped history table: exact lookups for ids of any shape, rows in their order, defects named."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from models import history_table as H
from models.ids import IdMap

IDS = ["u1", "", "ünï €", "a,b", 'say "hi"', "two\nlines", "x" * 300, "0", "00", "u10"]


def _write(folder: Path, users: list[str]) -> IdMap:
    items = IdMap(["i1", "i2", "i3"])
    steps = [["i1", "i2"][: 1 + n % 2] + (["brand-new"] if n == 3 else []) for n in range(len(users))]
    times = [[float(n)] + [math.nan if n == 1 else 1.0] * (len(s) - 1) for n, s in enumerate(steps)]
    H.HistoryColumns(users, steps, times, items).write(folder)
    return items


def test_every_user_is_found_with_its_steps_in_order(tmp_path: Path) -> None:
    items = _write(tmp_path / "t", IDS)
    table = H.HistoryTable(tmp_path / "t")
    assert len(table) == len(IDS) and sorted(table.users()) == sorted(IDS)
    for n, user in enumerate(IDS):
        got = table.timeline(user, items)
        want_items = ["i1", "i2"][: 1 + n % 2] + (["brand-new"] if n == 3 else [])
        assert [i for i, _, _ in got] == want_items, user
        assert got[0][1] == float(n)
    # An id the model's map lacks is kept by raw id, outside the map's indices.
    row = table.get("a,b")
    assert row is not None and int(row.items.max()) >= len(items) and table.extra_ids == ["brand-new"]
    assert row.last_time() == 3.0 and table.get("u1") is not None
    nan_row = table.get("")  # its second step has no time
    assert nan_row is not None and math.isnan(float(nan_row.times[1])) and nan_row.last_time() == 1.0
    assert table.get("u2") is None and table.get("U1") is None and table.get("u1 ") is None


def test_users_whose_hashes_collide_are_told_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(H, "user_hash", lambda user: 7)
    items = _write(tmp_path / "t", IDS)
    table = H.HistoryTable(tmp_path / "t")
    for n, user in enumerate(IDS):
        assert table.timeline(user, items)[0][1] == float(n)
    assert table.get("nobody") is None


def test_no_users_is_a_table(tmp_path: Path) -> None:
    H.HistoryColumns([], [], [], IdMap()).write(tmp_path / "t")
    table = H.HistoryTable(tmp_path / "t")
    assert len(table) == 0 and table.get("u1") is None and list(table.users()) == []


def test_actions_round_trip(tmp_path: Path) -> None:
    users, acts = IdMap(["s1", "s2"]), IdMap(["a2q", "<-a2q"])
    H.HistoryColumns(["s1"], [["s2", "s9"]], [[1.0, 2.0]], users, actions=[["a2q", "<-a2q"]], action_ids=acts).write(
        tmp_path / "t"
    )
    assert H.HistoryTable(tmp_path / "t").timeline("s1", users, acts) == [("s2", 1.0, "a2q"), ("s9", 2.0, "<-a2q")]


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("times", np.zeros(2), "differ in length"),
        ("ends", np.zeros(len(IDS)), "expected a 1-d int64"),
        ("keys", np.zeros((2, 2), dtype=np.uint8), "expected a 1-d uint8"),
    ],
)
def test_inconsistent_columns_are_refused_by_name(tmp_path: Path, column: str, value: np.ndarray, problem: str) -> None:
    _write(tmp_path / "t", IDS)
    np.save(tmp_path / "t" / f"{column}.npy", value)
    with pytest.raises(H.HistoryTableError, match=problem):
        H.HistoryTable(tmp_path / "t")
    (tmp_path / "t" / f"{column}.npy").unlink()
    with pytest.raises(H.HistoryTableError, match=f"{column}.npy: missing"):
        H.HistoryTable(tmp_path / "t")


def test_a_pickled_column_is_not_loaded(tmp_path: Path) -> None:
    _write(tmp_path / "t", IDS)
    np.save(tmp_path / "t" / "items.npy", np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(H.HistoryTableError, match=r"items\.npy: expected a 1-d int32 array, found 1-d object"):
        H.HistoryTable(tmp_path / "t")


def _mutate(folder: Path, column: str, change: object) -> None:
    path = folder / f"{column}.npy"
    arr = np.load(path).copy()
    change(arr)  # type: ignore[operator]
    np.save(path, arr)


def _swap_first_two(a: np.ndarray) -> None:
    a[[0, 1]] = a[[1, 0]]


@pytest.mark.parametrize(
    ("column", "change", "problem"),
    [
        ("ends", _swap_first_two, r"ends\.npy: row ends must be non-negative and in ascending order"),
        ("ends", lambda a: a.__setitem__(0, -1), r"ends\.npy: row ends must be non-negative"),
        ("key_ends", _swap_first_two, r"key_ends\.npy: row ends must be non-negative and in ascending order"),
        ("hashes", _swap_first_two, r"hashes\.npy: user hashes must be in ascending order"),
        ("items", lambda a: a.__setitem__(0, 10_000), r"items\.npy: an index outside"),
        ("items", lambda a: a.__setitem__(0, -3), r"items\.npy: an index outside"),
        ("times", lambda a: a.__setitem__(0, np.inf), r"times\.npy: a time is infinite"),
        ("times", lambda a: a.__setitem__(-1, -np.inf), r"times\.npy: a time is infinite"),
        ("keys", lambda a: a.__setitem__(0, 0xFF), r"keys\.npy: a user id is not valid UTF-8"),
    ],
)
def test_every_row_invariant_is_checked_at_open(tmp_path: Path, column: str, change: object, problem: str) -> None:
    items = _write(tmp_path / "t", IDS)
    H.HistoryTable(tmp_path / "t", n_ids=len(items))  # whole, it opens
    _mutate(tmp_path / "t", column, change)
    with pytest.raises(H.HistoryTableError, match=problem):
        H.HistoryTable(tmp_path / "t", n_ids=len(items))


def test_indices_are_checked_against_the_map_and_the_extra_ids(tmp_path: Path) -> None:
    items = _write(tmp_path / "t", IDS)  # one extra id ("brand-new") after the map's
    top = int(np.load(tmp_path / "t" / "items.npy").max())
    assert top == len(items)  # the extra id's index
    H.HistoryTable(tmp_path / "t", n_ids=len(items))
    with pytest.raises(H.HistoryTableError, match=r"items\.npy"):
        H.HistoryTable(tmp_path / "t", n_ids=len(items) - 1)


def test_actions_are_checked_against_the_action_map(tmp_path: Path) -> None:
    users, acts = IdMap(["s1", "s2", "s9"]), IdMap(["a2q", "<-a2q"])
    H.HistoryColumns(["s1"], [["s2", "s9"]], [[1.0, 2.0]], users, [["a2q", "<-a2q"]], acts).write(tmp_path / "t")
    H.HistoryTable(tmp_path / "t", n_ids=len(users), n_actions=len(acts))
    with pytest.raises(H.HistoryTableError, match=r"actions\.npy: an action index outside"):
        H.HistoryTable(tmp_path / "t", n_ids=len(users), n_actions=len(acts) - 1)


def test_the_writer_refuses_what_the_reader_would(tmp_path: Path) -> None:
    items = IdMap(["i1"])
    with pytest.raises(ValueError, match="a time is infinite"):
        H.HistoryColumns(["u1"], [["i1"]], [[math.inf]], items).write(tmp_path / "a")
    with pytest.raises(ValueError, match="not valid Unicode"):
        H.HistoryColumns(["u\ud800"], [["i1"]], [[1.0]], items).write(tmp_path / "b")
    with pytest.raises(ValueError, match="not valid Unicode"):
        H.HistoryColumns(["u1"], [["i\udfff"]], [[1.0]], items).write(tmp_path / "c")


def test_a_fifo_column_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    _write(tmp_path / "t", IDS)
    (tmp_path / "t" / "items.npy").unlink()
    os.mkfifo(tmp_path / "t" / "items.npy")  # opening it for reading would wait for a writer forever
    with pytest.raises(H.HistoryTableError, match=r"items\.npy: not a regular file"):
        H.HistoryTable(tmp_path / "t")


@pytest.mark.parametrize("order", ["in order", "shuffled"])
def test_the_request_path_lookup_equals_the_row_it_reads(tmp_path: Path, order: str) -> None:
    """span / known_items / newest_time (memoryviews, shortcuts for clean tables) against the row itself."""
    rng = np.random.default_rng(0)
    items = IdMap([f"i{n}" for n in range(20)])
    users = [f"u{n}" for n in range(60)]
    steps = [[f"i{x}" for x in rng.integers(0, 20, size=n % 7)] for n in range(60)]
    times = [sorted(rng.uniform(0, 1e9, size=len(s)).tolist()) for s in steps]
    if order == "shuffled":
        times = [t[::-1] for t in times]
    H.HistoryColumns(users, steps, times, items).write(tmp_path / "clean")
    steps[5] = [*steps[5], "not-in-the-map"]  # an extra id, and a step without a time
    times[5] = [*times[5], math.nan]
    H.HistoryColumns(users, steps, times, items).write(tmp_path / "mixed")
    for name in ("clean", "mixed"):
        table = H.HistoryTable(tmp_path / name, n_ids=len(items))
        for user in [*users, "nobody"]:
            row = table.get(user)
            found = table.span(user)
            if row is None:
                assert found is None
                continue
            assert found is not None
            x = row.items
            assert table.known_items(*found, len(items)) == x[(x >= 2) & (x < len(items))].tolist()
            assert table.newest_time(*found) == row.last_time(), (name, user)


def test_the_popular_head_is_the_most_frequent_share_of_the_map(tmp_path: Path) -> None:
    ids = IdMap([f"i{n}" for n in range(250)])
    # i7 in 5 steps, i3 in 4, i9 in 2 and the rest once each; "not-in-map" (extra ids) is never the head.
    steps = [["i7", "i3", "i9"], ["i7", "i3", "not-in-map", "not-in-map"], ["i7", "i3", "i9", "i7"], ["i3", "i7", "i1"]]
    H.HistoryColumns(["a", "b", "c", "d"], steps, [[1.0] * len(s) for s in steps], ids).write(tmp_path / "t")
    table = H.HistoryTable(tmp_path / "t")
    idx = ids.index
    assert table.most_frequent(0.01, len(ids)) == [idx("i7"), idx("i3"), idx("i9")]  # ceil(1% of 250) = 3
    assert table.most_frequent(0.001, len(ids)) == [idx("i7")]  # rounded up
    assert table.most_frequent(0.02, len(ids)) == [idx("i7"), idx("i3"), idx("i9"), idx("i1")]  # only items seen
