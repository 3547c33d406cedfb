"""Users' final histories in an artifact, as columns the service memory-maps (docs/decisions/history-table.md).

artifacts/<name>/<version>/histories/
  hashes.npy    uint64 (U,)  an 8-byte BLAKE2b of each user id, ascending: rows are in this order
  key_ends.npy  int64 (U,)   end of each row's user id in keys.npy
  keys.npy      uint8        the user ids' UTF-8 bytes, concatenated in row order
  ends.npy      int64 (U,)   end of each row's steps in the step columns
  items.npy     int32 (N,)   each step's entity: an index of the task's id map (items, or users for the
                             social model); from len(map) on, an id of extra_ids.json (unknown to the model)
  times.npy     float64 (N,) unix seconds; NaN when the data has no time
  actions.npy   int32 (N,)   the step's action index (social model only)
  extra_ids.json             raw ids a history holds that the model's map does not
Steps of a row are oldest first. Every file is opened read-only with mmap: nothing is parsed at start,
the pages are shared by every worker on the host, and only the rows a request reads are paged in.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import mmap
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from models.ids import N_SPECIAL, IdMap, encodable

FOLDER = "histories"
_COLUMNS = ("hashes", "key_ends", "keys", "ends", "items", "times")
_DTYPES: dict[str, type[np.generic]] = {
    "hashes": np.uint64,
    "key_ends": np.int64,
    "keys": np.uint8,
    "ends": np.int64,
    "items": np.int32,
    "times": np.float64,
    "actions": np.int32,
}
EXTRA_IDS = "extra_ids.json"


class HistoryTableError(ValueError):
    """A histories folder with a missing or inconsistent file (the message names the file inside it)."""


def map_column(path: Path, want: type[np.generic]) -> np.ndarray:
    """A 1-d .npy column of dtype `want`, memory-mapped read-only and marked for random access.

    Requests read rows at random: MADV_RANDOM turns the kernel's read-ahead off, so a lookup reads
    the pages it touches (5,000 random users of a 5M-user table: 113 MB of file pages; docs/BENCHMARKS.md).
    """
    name = path.name
    try:
        # O_NONBLOCK: a FIFO put in place of a column must not block the loading thread; it is then
        # refused as not a regular file (models/artifact.py checks the whole folder first as well).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise HistoryTableError(f"{name}: not a regular file")
        with os.fdopen(fd, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            )
            shape, _fortran, dtype = read_header(f)  # never unpickles: object arrays are refused below
            if dtype != want or len(shape) != 1:
                raise HistoryTableError(f"{name}: expected a 1-d {np.dtype(want)} array, found {len(shape)}-d {dtype}")
            if shape[0] == 0:  # an empty file region cannot be mapped
                return np.zeros(0, dtype=dtype)
            offset = f.tell()
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_RANDOM)
        return np.frombuffer(mm, dtype=dtype, count=shape[0], offset=offset)
    except (OSError, ValueError, EOFError) as exc:
        if isinstance(exc, HistoryTableError):
            raise
        problem = "missing" if not path.exists() else "unreadable"
        raise HistoryTableError(f"{name}: {problem} ({type(exc).__name__})") from None


def user_hash(user: str) -> int:
    """Stable across processes and versions (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(user.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Row:
    """One user's stored steps, oldest first (read-only views into the mapped columns)."""

    items: np.ndarray  # int32 (n,)
    times: np.ndarray  # float64 (n,)
    actions: np.ndarray | None  # int32 (n,)

    def last_time(self) -> float | None:
        """The newest known time, or None when no step has one."""
        t = self.times[~np.isnan(self.times)]
        return float(t.max()) if t.size else None


def _column_problem(
    cols: dict[str, np.ndarray], extra: int, *, n_ids: int | None, n_actions: int | None
) -> tuple[str, str] | None:
    """The first broken invariant of a table's columns as (file, problem), or None. Vectorised, and
    reductions rather than masks where they can be (a 50M-step table is checked without copies)."""
    hashes, key_ends, keys, ends = cols["hashes"], cols["key_ends"], cols["keys"], cols["ends"]
    items, times, actions = cols["items"], cols["times"], cols.get("actions")
    users, steps = len(hashes), len(items)
    if len(key_ends) != users or len(ends) != users:
        return "hashes.npy", "hashes, key_ends and ends differ in length"
    if len(times) != steps or (actions is not None and len(actions) != steps):
        return "items.npy", "items, times and actions differ in length"
    for name, col, total in (("ends", ends, steps), ("key_ends", key_ends, len(keys))):
        if users and (int(col[0]) < 0 or not bool(np.all(col[1:] >= col[:-1]))):
            return f"{name}.npy", "row ends must be non-negative and in ascending order"
        if users and int(col[-1]) != total:
            return f"{name}.npy", "the last row does not end where the columns do"
        if not users and total:
            return f"{name}.npy", "steps or keys without a row"
    if users > 1 and not bool(np.all(hashes[1:] >= hashes[:-1])):
        return "hashes.npy", "user hashes must be in ascending order"
    # Each key must be whole UTF-8: no row may start inside a character.
    starts = key_ends[:-1][key_ends[:-1] < len(keys)]
    if bool(np.any((keys[starts] & 0xC0) == 0x80)):
        return "keys.npy", "a user id is not valid UTF-8"
    try:
        keys.tobytes().decode()
    except UnicodeDecodeError:
        return "keys.npy", "a user id is not valid UTF-8"
    if steps:
        top = n_ids + extra if n_ids is not None else None
        if int(items.min()) < 0 or (top is not None and int(items.max()) >= top):
            return "items.npy", f"an index outside 0..{top - 1 if top is not None else 'n'} (the id map and extra ids)"
        # NaN is "no time"; an infinity is corrupt. fmax/fmin skip NaN without a copy.
        if math.isinf(float(np.fmax.reduce(times))) or math.isinf(float(np.fmin.reduce(times))):
            return "times.npy", "a time is infinite"
        if actions is not None and (
            int(actions.min()) < 0 or (n_actions is not None and int(actions.max()) >= n_actions)
        ):
            return "actions.npy", f"an action index outside 0..{(n_actions or 0) - 1}"
    return None


class HistoryTable:
    """Read side: lookup by raw user id through the sorted hashes, rows as slices of the columns.

    Every invariant a lookup relies on is checked once when it opens (`n_ids`: the size of the id map
    the steps index, `n_actions`: of the action map): a table that breaks one is refused, naming the file.
    """

    def __init__(self, folder: Path, *, n_ids: int | None = None, n_actions: int | None = None) -> None:
        self.folder = folder
        cols: dict[str, np.ndarray] = {}
        for name in (*_COLUMNS, "actions"):
            path = folder / f"{name}.npy"
            if name == "actions" and not path.exists():
                continue
            cols[name] = map_column(path, _DTYPES[name])
        self.hashes, self.key_ends, self.keys = cols["hashes"], cols["key_ends"], cols["keys"]
        self.ends, self.items, self.times = cols["ends"], cols["items"], cols["times"]
        self.actions = cols.get("actions")
        try:
            extra = json.loads((folder / EXTRA_IDS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise HistoryTableError(f"{EXTRA_IDS}: missing or not JSON") from None
        if not isinstance(extra, list) or not all(isinstance(x, str) and encodable(x) for x in extra):
            raise HistoryTableError(f"{EXTRA_IDS}: must be a list of valid Unicode strings")
        self.extra_ids: list[str] = extra
        problem = _column_problem(cols, len(extra), n_ids=n_ids, n_actions=n_actions)
        if problem is not None:
            raise HistoryTableError(f"{problem[0]}: {problem[1]}")
        # The request path's lookups read Python ints through memoryviews: a numpy scalar per index and
        # a mask per row cost several times more (docs/decisions/request-path-threads.md).
        self._hash_at, self._key_end_at, self._end_at = (c.data for c in (self.hashes, self.key_ends, self.ends))
        self._key_bytes, self._item_at, self._time_at = (c.data for c in (self.keys, self.items, self.times))
        self._item_range = (int(self.items.min()), int(self.items.max())) if len(self.items) else (0, 0)
        self._times_in_order = _times_in_row_order(self.times, self.ends)

    def __len__(self) -> int:
        return len(self.hashes)

    def _key(self, row: int) -> bytes:
        start = self._key_end_at[row - 1] if row else 0
        return self._key_bytes[start : self._key_end_at[row]].tobytes()

    def find(self, user: str) -> int | None:
        """The row of `user`, or None."""
        h = user_hash(user)
        key = user.encode()
        row = bisect.bisect_left(self._hash_at, h)
        # Equal hashes (a 64-bit collision) sit next to each other: compare the ids themselves.
        while row < len(self._hash_at) and self._hash_at[row] == h:
            if self._key(row) == key:
                return row
            row += 1
        return None

    def span(self, user: str) -> tuple[int, int] | None:
        """Where `user`'s steps lie in the step columns, (start, end), or None."""
        row = self.find(user)
        if row is None:
            return None
        return (self._end_at[row - 1] if row else 0), self._end_at[row]

    def known_items(self, start: int, end: int, n_ids: int) -> list[int]:
        """The steps' entities that index the model's map (neither special nor extra), oldest first."""
        low, high = self._item_range
        if low >= N_SPECIAL and high < n_ids:  # the whole table is: no mask needed
            return self._item_at[start:end].tolist()
        x = self.items[start:end]
        return x[(x >= N_SPECIAL) & (x < n_ids)].tolist()

    def newest_time(self, start: int, end: int) -> float | None:
        """The newest known time of the steps, or None when none has one."""
        if self._times_in_order:
            return self._time_at[end - 1] if end > start else None
        return Row(self.items[start:end], self.times[start:end], None).last_time()

    def most_frequent(self, share: float, n_ids: int) -> list[int]:
        """The `share` most frequent entities of the map's (rounded up; ties by index; never one no step
        holds), most frequent first: the popular head a served list's items are measured against."""
        return self.by_count(n_ids, math.ceil(share * (n_ids - N_SPECIAL)))

    def counts(self, n_ids: int) -> np.ndarray:
        """(n_ids,) int64: how many steps hold each entity of the map (specials and extra ids: 0)."""
        x = self.items[(self.items >= N_SPECIAL) & (self.items < n_ids)]
        return np.bincount(x, minlength=n_ids)

    def by_count(self, n_ids: int, limit: int) -> list[int]:
        """The `limit` most frequent entities of the map's steps, most frequent first (ties by index; never
        one no step holds)."""
        counts = self.counts(n_ids)[N_SPECIAL:]
        order = np.argsort(-counts, kind="stable")[:limit]
        return [int(i) + N_SPECIAL for i in order if counts[i] > 0]

    def items_at(self, start: int, end: int, t: float) -> set[int]:
        """The entities of the steps whose time is `t` (where a newer version's table and the live events
        meet: several steps can share a second)."""
        times = self.times[start:end]
        return set(self.items[start:end][times == t].tolist())

    def row(self, index: int) -> Row:
        start, end = (int(self.ends[index - 1]) if index else 0), int(self.ends[index])
        return Row(
            self.items[start:end], self.times[start:end], None if self.actions is None else self.actions[start:end]
        )

    def get(self, user: str) -> Row | None:
        found = self.find(user)
        return None if found is None else self.row(found)

    def user(self, row: int) -> str:
        """The user id of a row."""
        return self._key(row).decode()

    def users(self) -> Iterator[str]:
        """Every user id, in row order."""
        for row in range(len(self)):
            yield self.user(row)

    def raw_ids(self, row: Row, ids: IdMap) -> list[str | None]:
        """The row's entities as raw ids (None where the map's index is a special one)."""
        n = len(ids)
        return [ids.raw(x) if x < n else self.extra_ids[x - n] for x in row.items.tolist()]

    def timeline(self, user: str, ids: IdMap, action_ids: IdMap | None = None) -> list[tuple[str, float, str | None]]:
        """`user`'s steps as (raw id, unix time or NaN, raw action or None), oldest first; [] when absent."""
        row = self.get(user)
        if row is None:
            return []
        raws = self.raw_ids(row, ids)
        acts: list[str | None] = [None] * len(raws)
        if row.actions is not None and action_ids is not None:
            acts = [action_ids.raw(a) if 0 <= a < len(action_ids) else None for a in row.actions.tolist()]
        return [(r or "", t, a) for r, t, a in zip(raws, row.times.tolist(), acts, strict=True)]


def _times_in_row_order(times: np.ndarray, ends: np.ndarray, chunk: int = 1 << 22) -> bool:
    """Whether every row's times are known and non-decreasing (then a row's newest is its last). One byte
    per step marks the row starts; the comparison runs in chunks."""
    if not len(times) or bool(np.isnan(times.min())):  # min propagates NaN: one pass, no copy
        return not len(times)
    starts = np.zeros(len(times), dtype=bool)
    starts[ends[:-1][ends[:-1] < len(times)]] = True  # a row may start lower than the one before ends
    for lo in range(0, len(times) - 1, chunk):
        hi = min(lo + chunk, len(times) - 1)
        down = np.flatnonzero(times[lo + 1 : hi + 1] < times[lo:hi]) + lo + 1
        if not bool(starts[down].all()):
            return False
    return True


def hash_order(users: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """A table's row order for `users`: (their hashes, ascending; their positions in that order).
    Equal hashes keep the given order."""
    hashes = np.fromiter((user_hash(u) for u in users), dtype=np.uint64, count=len(users))
    order = np.argsort(hashes, kind="stable")
    return hashes[order], order


def step_positions(starts: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(sum of lengths[rows],) int64: where the steps of `rows` lie in their columns, row after row,
    each row's `lengths[r]` steps from `starts[r]`; without a Python loop over steps."""
    n = lengths[rows]
    if not len(n):
        return np.zeros(0, np.int64)
    before = np.concatenate([[0], np.cumsum(n)[:-1]])
    return np.repeat(starts[rows] - before, n) + np.arange(int(n.sum()), dtype=np.int64)


def open_column(folder: Path, name: str, n: int) -> BinaryIO:
    """`folder`/`name`.npy opened for writing, its header (a 1-d column of `n`) written: the caller
    writes the values after it, in order, in pieces (`write_values`)."""
    f = (folder / f"{name}.npy").open("wb")
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(_DTYPES[name])), "fortran_order": False, "shape": (n,)}
    np.lib.format.write_array_header_1_0(f, header)
    return f


def write_values(f: BinaryIO, name: str, values: np.ndarray) -> None:
    """The next values of an `open_column` file."""
    f.write(np.ascontiguousarray(values, dtype=_DTYPES[name]).data)


def check_rows(
    users: Sequence[str], lengths: np.ndarray, *, items: np.ndarray, times: np.ndarray, extra_ids: Sequence[str] = ()
) -> None:
    """Refuse rows no table may hold (ValueError): counts that disagree, a user twice, an id that is
    not Unicode, an infinite time."""
    if len(lengths) != len(users) or int(lengths.sum()) != len(items) or len(times) != len(items):
        raise ValueError("users, lengths, items and times do not agree")
    if len(set(users)) != len(users):
        raise ValueError("a user appears twice")
    bad = next((x for x in [*users, *extra_ids] if not encodable(x)), None)
    if bad is not None:
        raise ValueError(f"an id is not valid Unicode: {bad.encode(errors='backslashreplace').decode()!r}")
    if len(times) and bool(np.isinf(np.asarray(times, dtype=np.float64)).any()):
        raise ValueError("a time is infinite")


def write_table(
    folder: Path,
    users: Sequence[str],
    lengths: Sequence[int] | np.ndarray,
    *,
    items: np.ndarray,
    times: np.ndarray,
    actions: np.ndarray | None = None,
    extra_ids: Sequence[str] = (),
) -> None:
    """Write a table into `folder` (created). Steps are given user by user in `users` order, each
    user's `lengths[u]` steps oldest first; rows are reordered by hash here."""
    lengths = np.asarray(lengths, dtype=np.int64)
    check_rows(users, lengths, items=items, times=times, extra_ids=extra_ids)
    hashes, order = hash_order(users)
    starts = np.cumsum(lengths) - lengths
    take = step_positions(starts, lengths, order)
    encoded = [users[i].encode() for i in order.tolist()]
    folder.mkdir(parents=True, exist_ok=True)
    cols = {
        "hashes": hashes,
        "key_ends": np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))),
        "keys": np.frombuffer(b"".join(encoded), dtype=np.uint8),
        "ends": np.cumsum(lengths[order]),
        "items": np.asarray(items, dtype=np.int32)[take],
        "times": np.asarray(times, dtype=np.float64)[take],
    }
    if actions is not None:
        cols["actions"] = np.asarray(actions, dtype=np.int32)[take]
    for name, arr in cols.items():
        np.save(folder / f"{name}.npy", np.ascontiguousarray(arr, dtype=_DTYPES[name]), allow_pickle=False)
    write_extra_ids(folder, extra_ids)


def write_extra_ids(folder: Path, extra_ids: Sequence[str]) -> None:
    (folder / EXTRA_IDS).write_text(json.dumps(list(extra_ids)), encoding="utf-8")


@dataclass
class HistoryColumns:
    """What a training job hands the exporter: users' steps with raw ids, mapped through `ids` on write."""

    users: Sequence[str]
    steps: Sequence[Sequence[str]]  # per user, raw entity ids, oldest first
    times: Sequence[Sequence[float | None]]
    ids: IdMap
    actions: Sequence[Sequence[str]] | None = None
    action_ids: IdMap | None = None

    def write(self, folder: Path) -> None:
        flat = [s for seq in self.steps for s in seq]
        index = np.asarray(self.ids.indices(flat), dtype=np.int64)
        unknown = index < N_SPECIAL
        extra: list[str] = []
        if unknown.any():  # not in the model's map: kept by raw id, so an export of the log loses nothing
            uniques, codes = np.unique(np.asarray(flat, dtype=object)[unknown], return_inverse=True)
            index[unknown] = len(self.ids) + codes
            extra = [str(u) for u in uniques]
        times = np.fromiter(
            (math.nan if t is None else t for seq in self.times for t in seq), dtype=np.float64, count=len(flat)
        )
        acts = None
        if self.actions is not None:
            assert self.action_ids is not None
            acts = np.asarray(self.action_ids.indices([a for seq in self.actions for a in seq]), dtype=np.int32)
        write_table(
            folder,
            list(self.users),
            [len(s) for s in self.steps],
            items=index,
            times=times,
            actions=acts,
            extra_ids=extra,
        )
