"""Interaction logs in several formats -> one `Interactions` table of per-user sequences.

Formats: RecBole atomic files (`.inter`, optional `.item` with `release_year`); GroupLens
MovieLens (`u.data`/`u.item`, `ratings.dat`/`movies.dat`, `ratings.csv`/`movies.csv`); plain
`user item` lines already in time order; a generic CSV or Parquet table (user, item, timestamp)
with an optional item table (item, release time).
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)
YEAR_IN_TITLE = re.compile(r"\((\d{4})\)\s*$")
USER_COLS = ("user_id", "user", "userId", "uid")
ITEM_COLS = ("item_id", "item", "movieId", "iid")
TIME_COLS = ("timestamp", "time", "ts")
RELEASE_COLS = ("release_time", "release_year", "released_at", "release")
# Spellings of a missing value seen in real item tables (ml-100k writes "unkonwn").
MISSING = frozenset({"", "unknown", "unkonwn", "nan", "none", "null", "na", "n/a"})


class DataFormatError(ValueError):
    """A malformed input file: names the file, the line and what is wrong."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = str(path), line


@dataclass
class Interactions:
    """Per-user item sequences in time order; raw ids stay strings."""

    users: list[str]
    items: list[list[str]]  # items[u] = user u's items, oldest first
    times: list[list[float]]  # unix seconds; NaN where the source has no timestamps
    release: dict[str, float] = field(default_factory=dict)  # item -> release, in release_unit
    release_unit: str | None = None  # "year" or "second"; None = no release metadata
    source: str = ""
    sha256: str = ""

    @property
    def n_interactions(self) -> int:
        return sum(len(s) for s in self.items)

    def item_set(self) -> list[str]:
        """Distinct items in order of first appearance."""
        seen: dict[str, None] = {}
        for seq in self.items:
            for it in seq:
                seen.setdefault(it)
        return list(seen)


def _sha256(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _group(rows: Iterable[tuple[str, str, float]]) -> tuple[list[str], list[list[str]], list[list[float]]]:
    """Group (user, item, time) rows by user; stable sort by time keeps file order on ties."""
    by_user: dict[str, list[tuple[float, int, str]]] = {}
    for n, (u, i, t) in enumerate(rows):
        by_user.setdefault(u, []).append((t, n, i))
    users, items, times = [], [], []
    for u, evs in by_user.items():
        if not all(t != t for t, _, _ in evs):  # NaN != NaN: keep file order when no times
            evs.sort(key=lambda e: (e[0], e[1]))
        users.append(u)
        items.append([i for _, _, i in evs])
        times.append([t for t, _, _ in evs])
    return users, items, times


def _release_year(value: str, title: str) -> float | None:
    """A release year from its field, else from a "(1995)" at the end of the title, else None."""
    if value.strip().isdigit():
        return float(value)
    m = YEAR_IN_TITLE.search(title.strip())
    return float(m.group(1)) if m else None


def _float(value: str, path: Path, line: int, what: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise DataFormatError(path, line, f"{what} {value!r} is not a number") from None


def _pick(header: list[str], candidates: tuple[str, ...], path: Path, required: bool = True) -> int | None:
    for name in candidates:
        if name in header:
            return header.index(name)
    if required:
        raise DataFormatError(path, 1, f"no column among {list(candidates)} in header {header}")
    return None


# --- RecBole atomic files -------------------------------------------------------------------------


def _read_atomic(path: Path) -> Iterator[tuple[int, list[str], list[str]]]:
    """Yield (line number, header names without types, fields) for a RecBole atomic file."""
    with path.open(encoding="utf-8") as f:
        header_line = f.readline().rstrip("\n")
        header = [h.split(":")[0] for h in header_line.split("\t")]
        for n, line in enumerate(f, start=2):
            line = line.rstrip("\n")
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) != len(header):
                raise DataFormatError(path, n, f"expected {len(header)} tab-separated fields, got {len(parts)}")
            yield n, header, parts


def load_recbole(inter: Path) -> Interactions:
    rows = []
    header: list[str] = []
    ui = ii = ti = None
    for n, header, parts in _read_atomic(inter):
        if ui is None:
            ui, ii = _pick(header, ("user_id",), inter), _pick(header, ("item_id",), inter)
            ti = _pick(header, ("timestamp",), inter, required=False)
        assert ui is not None and ii is not None
        t = _float(parts[ti], inter, n, "timestamp") if ti is not None else float("nan")
        rows.append((parts[ui], parts[ii], t))
    if not header:
        raise DataFormatError(inter, 1, "empty file")
    users, items, times = _group(rows)
    data = Interactions(users, items, times, source=str(inter))
    item_file = inter.with_suffix(".item")
    files = [inter]
    if item_file.exists():
        files.append(item_file)
        for n, header, parts in _read_atomic(item_file):
            yi = _pick(header, ("release_year",), item_file, required=False)
            if yi is None:
                break
            year = _release_year(parts[yi], parts[header.index("movie_title")] if "movie_title" in header else "")
            if year is not None:
                data.release[parts[header.index("item_id")]] = year
            elif parts[yi].strip().lower() not in MISSING:
                log.warning("%s:%d: release_year %r is not a year; item kept without one", item_file, n, parts[yi])
        data.release_unit = "year" if data.release else None
    data.sha256 = _sha256(files)
    return data


# --- GroupLens MovieLens --------------------------------------------------------------------------


def load_grouplens_100k(folder: Path) -> Interactions:
    udata = folder / "u.data"
    rows = []
    with udata.open(encoding="latin-1") as f:
        for n, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 4:
                raise DataFormatError(udata, n, f"expected 'user item rating timestamp', got {line.strip()!r}")
            rows.append((parts[0], parts[1], _float(parts[3], udata, n, "timestamp")))
    data = Interactions(*_group(rows), source=str(udata))
    uitem = folder / "u.item"
    files = [udata]
    if uitem.exists():
        files.append(uitem)
        with uitem.open(encoding="latin-1") as f:
            for n, line in enumerate(f, start=1):
                parts = line.rstrip("\n").split("|")
                if len(parts) < 3:
                    raise DataFormatError(uitem, n, "expected 'id|title|release date|...'")
                if parts[2].strip():
                    try:
                        year = dt.datetime.strptime(parts[2].strip(), "%d-%b-%Y").year
                    except ValueError:
                        raise DataFormatError(uitem, n, f"bad release date {parts[2]!r}") from None
                    data.release[parts[0]] = float(year)
        data.release_unit = "year" if data.release else None
    data.sha256 = _sha256(files)
    return data


def _titles_years(path: Path, rows: Iterable[tuple[int, str, str]]) -> dict[str, float]:
    out = {}
    for _, item, title in rows:
        m = YEAR_IN_TITLE.search(title.strip())
        if m:
            out[item] = float(m.group(1))
    return out


def load_grouplens_dat(folder: Path) -> Interactions:
    ratings = folder / "ratings.dat"
    rows = []
    with ratings.open(encoding="latin-1") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            parts = line.strip().split("::")
            if len(parts) != 4:
                raise DataFormatError(ratings, n, "expected 'user::item::rating::timestamp'")
            rows.append((parts[0], parts[1], _float(parts[3], ratings, n, "timestamp")))
    data = Interactions(*_group(rows), source=str(ratings))
    movies = folder / "movies.dat"
    files = [ratings]
    if movies.exists():
        files.append(movies)
        with movies.open(encoding="latin-1") as f:
            entries = []
            for n, line in enumerate(f, start=1):
                parts = line.rstrip("\n").split("::")
                if len(parts) < 2:
                    raise DataFormatError(movies, n, "expected 'item::title::genres'")
                entries.append((n, parts[0], parts[1]))
        data.release = _titles_years(movies, entries)
        data.release_unit = "year" if data.release else None
    data.sha256 = _sha256(files)
    return data


# --- plain `user item` lines ----------------------------------------------------------------------


def load_user_item_lines(path: Path) -> Interactions:
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2:
                raise DataFormatError(path, n, f"expected 'user item', got {line.strip()!r}")
            rows.append((parts[0], parts[1], float("nan")))
    if not rows:
        raise DataFormatError(path, None, "no interactions")
    data = Interactions(*_group(rows), source=str(path))
    data.sha256 = _sha256([path])
    return data


# --- generic tables -------------------------------------------------------------------------------


def _time_value(value: object, path: Path, line: int, what: str) -> float:
    """Unix seconds from a number or an ISO 8601 string (UTC when no zone is given)."""
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, dt.datetime):
        v = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return v.timestamp()
    s = str(value).strip()
    try:
        return float(s)
    except ValueError:
        pass
    try:
        d = dt.datetime.fromisoformat(s)
    except ValueError:
        raise DataFormatError(path, line, f"{what} {s!r} is neither unix seconds nor ISO 8601") from None
    return (d if d.tzinfo else d.replace(tzinfo=dt.UTC)).timestamp()


def read_table(path: Path) -> tuple[list[str], list[tuple[int, list[object]]]]:
    """(header, [(line, values)]) of a CSV or Parquet table; Parquet rows count from 2 like CSV."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:  # optional dependency
            raise DataFormatError(path, None, "reading Parquet needs the 'parquet' extra (pyarrow)") from None
        table = pq.read_table(path)
        cols = [c.to_pylist() for c in table.columns]
        return list(table.column_names), [(n + 2, list(vals)) for n, vals in enumerate(zip(*cols, strict=True))]
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            raise DataFormatError(path, 1, "empty file") from None
        out: list[tuple[int, list[object]]] = []
        for n, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise DataFormatError(path, n, f"expected {len(header)} fields, got {len(row)}")
            out.append((n, list(row)))
        return header, out


def load_table(path: Path, item_table: Path | None = None) -> Interactions:
    header, rows = read_table(path)
    ui, ii = _pick(header, USER_COLS, path), _pick(header, ITEM_COLS, path)
    ti = _pick(header, TIME_COLS, path)
    assert ui is not None and ii is not None and ti is not None
    recs = []
    for n, vals in rows:
        if vals[ui] in (None, "") or vals[ii] in (None, ""):
            raise DataFormatError(path, n, "empty user or item id")
        recs.append((str(vals[ui]), str(vals[ii]), _time_value(vals[ti], path, n, "timestamp")))
    if not recs:
        raise DataFormatError(path, None, "no interactions")
    data = Interactions(*_group(recs), source=str(path))
    files = [path]
    if item_table is not None:
        files.append(item_table)
        iheader, irows = read_table(item_table)
        iid = _pick(iheader, ITEM_COLS, item_table)
        ri = _pick(iheader, RELEASE_COLS, item_table)
        assert iid is not None and ri is not None
        year_only = iheader[ri] == "release_year"
        for n, vals in irows:
            if vals[ri] is None or str(vals[ri]).strip().lower() in MISSING:
                continue
            if year_only:
                data.release[str(vals[iid])] = _float(str(vals[ri]), item_table, n, "release_year")
            else:
                data.release[str(vals[iid])] = _time_value(vals[ri], item_table, n, "release time")
        data.release_unit = ("year" if year_only else "second") if data.release else None
    data.sha256 = _sha256(files)
    return data


def load_interactions(path: Path, item_table: Path | None = None) -> Interactions:
    """Detect the format of `path` (a file or a dataset folder) and load it."""
    path = Path(path)
    if path.is_dir():
        inters = sorted(path.glob("*.inter"))
        if inters:
            return load_recbole(inters[0])
        if (path / "u.data").exists():
            return load_grouplens_100k(path)
        if (path / "ratings.dat").exists():
            return load_grouplens_dat(path)
        if (path / "ratings.csv").exists():
            movies = path / "movies.csv"
            return load_movielens_csv(path / "ratings.csv", movies if movies.exists() else None)
        raise DataFormatError(path, None, "no known interaction file (*.inter, u.data, ratings.dat, ratings.csv)")
    if not path.exists():
        raise DataFormatError(path, None, "no such file")
    if path.suffix == ".inter":
        return load_recbole(path)
    if path.suffix in (".csv", ".parquet"):
        return load_table(path, item_table)
    return load_user_item_lines(path)


def load_movielens_csv(ratings: Path, movies: Path | None) -> Interactions:
    data = load_table(ratings)
    if movies is not None:
        header, rows = read_table(movies)
        ii, ti = _pick(header, ITEM_COLS, movies), _pick(header, ("title",), movies)
        assert ii is not None and ti is not None
        data.release = _titles_years(movies, ((n, str(v[ii]), str(v[ti])) for n, v in rows))
        data.release_unit = "year" if data.release else None
        data.sha256 = _sha256([ratings, movies])
    return data
