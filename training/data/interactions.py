"""Interaction logs in several formats -> one `Interactions` table of per-user sequences.

Formats: RecBole atomic files (`.inter`, optional `.item` with `release_year`); GroupLens
MovieLens (`u.data`/`u.item`, `ratings.dat`/`movies.dat`, `ratings.csv`/`movies.csv`); plain
`user item` lines already in time order; a generic CSV or Parquet table (user, item, timestamp; an
empty timestamp keeps file order, as `retrainer.export_history` writes data without times) with an
optional item table (item, release time). Item tables' title and genre/category columns are kept
as display fields.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from models.ids import from_csv_cell
from training.data.tables import (
    MISSING,
    DataFormatError,
    is_csv,
    numbers,
    parquet_parts,
    pick,
    read_table,
    read_text_table,
    require_ids,
    sha256,
    table_chunks,
    unix_times,
)

log = logging.getLogger(__name__)
YEAR_IN_TITLE = re.compile(r"\((\d{4})\)\s*$")
USER_COLS = ("user_id", "user", "userId", "uid")
ITEM_COLS = ("item_id", "item", "movieId", "iid")
TIME_COLS = ("timestamp", "time", "ts")
RELEASE_COLS = ("release_time", "release_year", "released_at", "release")
# An item table's display columns, kept in the artifact for answers that ask for them.
TITLE_COLS = ("title", "movie_title", "name")
LIST_COLS = {"genres": ("genres", "genre", "class"), "categories": ("categories", "category")}


TIME_UNITS = {"s": 1.0, "ms": 1000.0}


@dataclass(frozen=True)
class Columns:
    """How a generic CSV or Parquet log names its columns, as another engine wrote it: empty names take
    the accepted ones (USER_COLS, ITEM_COLS, TIME_COLS); `event` with `keep`: only the rows whose event
    type is one of `keep` (views, purchases...) are read; `time_unit`: what a numeric time counts (ISO
    8601 texts are read as such whatever it says)."""

    user: str = ""
    item: str = ""
    time: str = ""
    event: str = ""
    keep: tuple[str, ...] = ()
    time_unit: str = "s"

    def __post_init__(self) -> None:
        if self.time_unit not in TIME_UNITS:
            raise ValueError(f"time unit {self.time_unit!r}: one of {sorted(TIME_UNITS)}")
        if bool(self.event) != bool(self.keep):
            raise ValueError("an event column and the event types to keep go together")

    def given(self) -> bool:
        return self != Columns()


@dataclass(frozen=True)
class Share:
    """One rank's part of a log that several ranks read: the users whose id hashes to `rank` modulo
    `world`. The hash is pandas' keyed SipHash of the id's text, the same on every host and run, so the
    ranks split the users without exchanging anything (docs/decisions/rank-shares.md)."""

    rank: int = 0
    world: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} of {self.world}")

    def keeps(self, user_ids: pd.Series) -> np.ndarray:
        """(N,) bool: which rows' users are this rank's."""
        # Each distinct id hashed once (Arrow's dictionary encoding finds them): converting every row to a
        # Python string first was a quarter of a rank's load at 20M rows.
        codes, uniques = pd.factorize(user_ids)
        hashed = pd.util.hash_array(np.asarray(uniques, dtype=object))
        return np.asarray(hashed % np.uint64(self.world) == np.uint64(self.rank))[codes]


@dataclass
class Interactions:
    """Per-user item sequences in time order, as columns: a log of tens of millions of rows holds one
    int32 and one float64 per row, not a Python object per id (docs/decisions/columnar-log.md).
    Raw ids stay strings."""

    users: list[str]  # raw user ids, in order of first appearance in the log
    item_ids: list[str]  # raw item ids: `items` holds indices into this list
    ends: np.ndarray  # int64 (U,): user u's rows are items[ends[u - 1]:ends[u]] (from 0 for u = 0)
    items: np.ndarray  # int32 (N,), each user's items oldest first
    times: np.ndarray  # float64 (N,) unix seconds; NaN where the source has no timestamps
    release: dict[str, float] = field(default_factory=dict)  # item -> release, in release_unit
    release_unit: str | None = None  # "year" or "second"; None = no release metadata
    # Display fields from the item table: name -> raw item id -> text or list of texts.
    item_fields: dict[str, dict[str, str | list[str]]] = field(default_factory=dict)
    source: str = ""
    sha256: str = ""

    @property
    def n_interactions(self) -> int:
        return len(self.items)

    def sequences(self, offset: int = 0) -> list[list[int]]:
        """Each user's items as indices + `offset` (what the training jobs index sequences with)."""
        return per_user((self.items.astype(np.int64) + offset).tolist(), self.ends)


def per_user(flat: list[Any], ends: np.ndarray) -> list[list[Any]]:
    """A flat list cut at CSR `ends` into one list per user."""
    # One conversion to Python objects, then a C-level slice per user (a tolist per user was 0.9 s
    # of a 5M-row load).
    bounds = ends.tolist()
    with _collector_paused():
        return [flat[a:b] for a, b in zip([0, *bounds[:-1]], bounds, strict=True)]


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Millions of new lists and no reference cycle: the cyclic garbage collector's passes over them
    were a third of a 5M-row load when loading built them (docs/decisions/gc-freeze.md)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def group_codes(
    user_codes: np.ndarray,
    users: list[str],
    item_codes: np.ndarray,
    item_ids: Sequence[str],
    times: np.ndarray,
    *,
    source: str,
) -> Interactions:
    """Rows given as codes into `users` and `item_ids` -> per-user sequences (users keep their order);
    each user's rows sorted by time, file order kept on ties and where there are no times. Items are
    renumbered in order of first appearance, user by user."""
    key = np.where(np.isnan(times), -np.inf, times)
    rows = np.lexsort((key, user_codes))  # by user, then time; lexsort is stable: file order on ties
    del key
    ends = np.cumsum(np.bincount(user_codes, minlength=len(users)))
    items = item_codes[rows]
    times = times[rows]
    del rows
    first_seen = pd.unique(items)  # hash-based: order of appearance, no sort of the whole column
    renumber = np.zeros(len(item_ids), dtype=np.int32)
    renumber[first_seen] = np.arange(len(first_seen), dtype=np.int32)
    return Interactions(
        users,
        np.asarray(item_ids, dtype=object)[first_seen].tolist(),
        ends.astype(np.int64),
        renumber[items],
        times,
        source=source,
    )


def group(users: pd.Series, items: pd.Series, times: np.ndarray, *, source: str) -> Interactions:
    """Rows of raw ids -> per-user sequences (users in order of first appearance); see group_codes."""
    user_codes, user_ids = pd.factorize(users)
    item_codes, item_ids = pd.factorize(items)
    return group_codes(
        user_codes,
        [str(u) for u in user_ids],
        item_codes,
        [str(i) for i in item_ids],
        np.asarray(times, dtype=np.float64),
        source=source,
    )


class _Codes:
    """Raw ids -> dense codes across the chunks of a table, in order of first appearance."""

    def __init__(self, *, csv: bool = False) -> None:
        self.index: dict[str, int] = {}
        self.csv = csv  # ids read from CSV cells: a spreadsheet-escaped one is taken back (models.ids)

    def encode(self, values: pd.Series) -> np.ndarray:
        codes, uniques = pd.factorize(values)
        index = self.index
        raws = (from_csv_cell(u) for u in uniques) if self.csv else uniques
        known = np.fromiter((index.setdefault(u, len(index)) for u in raws), dtype=np.int32, count=len(uniques))
        return known[codes]

    def ids(self) -> list[str]:
        return list(self.index)


def _release_years(values: pd.Series, titles: pd.Series | None) -> pd.Series:
    """A release year from its field, else from a "(1995)" at the end of the title; NaN when neither."""
    years = pd.to_numeric(values.where(values.str.strip().str.isdigit()), errors="coerce")
    if titles is not None:
        from_title = pd.to_numeric(titles.str.strip().str.extract(YEAR_IN_TITLE, expand=False), errors="coerce")
        years = years.fillna(from_title)
    return years


def describe_items(meta: pd.DataFrame, item_col: str, *, list_sep: str | None) -> dict[str, dict[str, str | list[str]]]:
    """An item table's title and genre/category columns, per raw item id; empty values left out.
    `list_sep` splits a list column (None: on whitespace)."""
    ids = meta[item_col].astype(str).str.strip()
    out: dict[str, dict[str, str | list[str]]] = {}
    title = next((c for c in TITLE_COLS if c in meta.columns), None)
    if title is not None:
        text = meta[title].fillna("").astype(str).str.strip()
        ok = text != ""
        out["title"] = dict(zip(ids[ok], text[ok], strict=True))
    for name, cols in LIST_COLS.items():
        col = next((c for c in cols if c in meta.columns), None)
        if col is None:
            continue
        lists = meta[col].fillna("").astype(str).str.split(list_sep)
        kept = {i: [v.strip() for v in vs if v.strip()] for i, vs in zip(ids, lists, strict=True)}
        out[name] = {i: vs for i, vs in kept.items() if vs}
    return {name: values for name, values in out.items() if values}


# --- RecBole atomic files -------------------------------------------------------------------------


def _atomic(path: Path) -> pd.DataFrame:
    df = read_text_table(path, sep="\t", expect=None)
    df.columns = [c.split(":")[0] if c != "_line" else c for c in df.columns]
    if df.empty:
        raise DataFormatError(path, 1, "empty file")
    return df


def load_recbole(inter: Path) -> Interactions:
    df = _atomic(inter)
    n_fields = len(df.columns) - 1
    short = df.iloc[:, :n_fields].isna().any(axis=1)
    if short.any():  # pragma: no cover - read_text_table reports it first
        raise DataFormatError(inter, int(df["_line"][short].iloc[0]), "missing fields")
    ui, ii = pick(df, ("user_id",), inter), pick(df, ("item_id",), inter)
    ti = pick(df, ("timestamp",), inter, required=False)
    assert ui is not None and ii is not None
    times = numbers(df, ti, inter, what="timestamp") if ti else np.full(len(df), np.nan)
    data = group(df[ui], df[ii], times, source=str(inter))
    files = [inter]
    item_file = inter.with_suffix(".item")
    if item_file.exists():
        files.append(item_file)
        meta = _atomic(item_file)
        if "release_year" in meta.columns:
            years = _release_years(meta["release_year"], meta.get("movie_title"))
            odd = years.isna() & ~meta["release_year"].str.strip().str.lower().isin(MISSING)
            for _, row in meta[odd].iterrows():
                log.warning(
                    "%s:%d: release_year %r is not a year; item kept without one",
                    item_file,
                    row["_line"],
                    row["release_year"],
                )
            ok = years.notna()
            data.release = dict(zip(meta["item_id"][ok], years[ok].astype(float), strict=True))
            data.release_unit = "year" if data.release else None
        data.item_fields = describe_items(meta, "item_id", list_sep=None)  # token_seq: space-separated
    data.sha256 = sha256(files)
    return data


# --- GroupLens MovieLens --------------------------------------------------------------------------


def load_grouplens_100k(folder: Path) -> Interactions:
    udata = folder / "u.data"
    df = read_text_table(
        udata,
        sep=r"\s+",
        names=("user", "item", "rating", "ts"),
        encoding="latin-1",
        expect="'user item rating timestamp'",
    )
    data = group(df["user"], df["item"], numbers(df, "ts", udata, what="timestamp"), source=str(udata))
    files = [udata]
    uitem = folder / "u.item"
    if uitem.exists():
        files.append(uitem)
        meta = pd.read_csv(
            uitem,
            sep="|",
            header=None,
            dtype=str,
            keep_default_na=False,
            encoding="latin-1",
            quoting=3,
        )
        meta["_line"] = np.arange(len(meta)) + 1
        dates = meta[2].str.strip()
        parsed = pd.to_datetime(dates, format="%d-%b-%Y", errors="coerce")
        bad = parsed.isna() & (dates != "")
        if bad.any():
            row = meta[bad].iloc[0]
            raise DataFormatError(uitem, int(row["_line"]), f"bad release date {row[2]!r}")
        ok = parsed.notna()
        data.release = dict(zip(meta[0][ok], parsed[ok].dt.year.astype(float), strict=True))
        data.release_unit = "year" if data.release else None
        data.item_fields = describe_items(_grouplens_genres(meta, folder / "u.genre"), "item", list_sep="|")
    data.sha256 = sha256(files)
    return data


def _grouplens_genres(meta: pd.DataFrame, genre_file: Path) -> pd.DataFrame:
    """u.item's title, and its genre flags (columns 5 on, named in u.genre) as one "a|b" column."""
    out = pd.DataFrame({"item": meta[0], "title": meta[1]})
    if not genre_file.exists():
        return out
    names = pd.read_csv(genre_file, sep="|", header=None, dtype=str, keep_default_na=False, encoding="latin-1")
    names = names[names[0].str.strip() != ""]
    flags = meta.iloc[:, 5 : 5 + len(names)] == "1"
    labels = np.asarray(names[0].str.strip())
    out["genres"] = ["|".join(labels[row]) for row in flags.to_numpy()]
    return out


def load_grouplens_dat(folder: Path) -> Interactions:
    ratings = folder / "ratings.dat"
    # "user::item::rating::time" split on ":" gives seven fields with the ids at 0, 2, 4, 6.
    df = read_text_table(
        ratings,
        sep=":",
        names=("user", "a", "item", "b", "rating", "c", "ts"),
        encoding="latin-1",
        expect="'user::item::rating::timestamp'",
    )
    data = group(df["user"], df["item"], numbers(df, "ts", ratings, what="timestamp"), source=str(ratings))
    files = [ratings]
    movies = folder / "movies.dat"
    if movies.exists():
        files.append(movies)
        meta = read_text_table(
            movies, sep="::", names=("item", "title", "genres"), encoding="latin-1", expect="'item::title::genres'"
        )
        years = _release_years(pd.Series([""] * len(meta)), meta["title"])
        ok = years.notna()
        data.release = dict(zip(meta["item"][ok], years[ok].astype(float), strict=True))
        data.release_unit = "year" if data.release else None
        data.item_fields = describe_items(meta, "item", list_sep="|")
    data.sha256 = sha256(files)
    return data


def load_movielens_csv(ratings: Path, movies: Path | None) -> Interactions:
    data = load_table(ratings)
    if movies is not None:
        meta = read_table(movies)
        ii, ti = pick(meta, ITEM_COLS, movies), pick(meta, ("title",), movies)
        assert ii is not None and ti is not None
        years = _release_years(pd.Series([""] * len(meta)), meta[ti])
        ok = years.notna()
        data.release = dict(zip(meta[ii][ok], years[ok].astype(float), strict=True))
        data.release_unit = "year" if data.release else None
        data.item_fields = describe_items(meta, ii, list_sep="|")
        data.sha256 = sha256([ratings, movies])
    return data


# --- plain `user item` lines ----------------------------------------------------------------------


def load_user_item_lines(path: Path) -> Interactions:
    df = read_text_table(path, sep=r"\s+", names=("user", "item"), expect="'user item'")
    if df.empty:
        raise DataFormatError(path, None, "no interactions")
    data = group(df["user"], df["item"], np.full(len(df), np.nan), source=str(path))
    data.sha256 = sha256([path])
    return data


# --- generic tables -------------------------------------------------------------------------------


def load_table(
    path: Path, item_table: Path | None = None, columns: Columns | None = None, *, share: Share | None = None
) -> Interactions:
    """A CSV or Parquet log read in chunks: each chunk's ids become integer codes before the next is
    read, so memory holds the codes and times of the whole log (of `share`'s users only, when given)
    and the strings of one chunk."""
    cols = columns or Columns()
    csv = is_csv(path)
    users, items = _Codes(csv=csv), _Codes(csv=csv)
    user_parts, item_parts, time_parts = [], [], []
    first_missing: int | None = None  # line of the first row without a timestamp
    for df in table_chunks(path):
        ui = pick(df, (cols.user,) if cols.user else USER_COLS, path)
        ii = pick(df, (cols.item,) if cols.item else ITEM_COLS, path)
        ti = pick(df, (cols.time,) if cols.time else TIME_COLS, path)
        assert ui is not None and ii is not None and ti is not None
        if cols.event:
            ei = pick(df, (cols.event,), path)
            df = df[df[ei].str.strip().isin(cols.keep)]
        if share is not None and share.world > 1:
            df = df[share.keeps(df[ui])]
        require_ids(df, (ui, ii), path)
        times = unix_times(df, ti, path, what="timestamp", allow_missing=True, per_second=TIME_UNITS[cols.time_unit])
        missing = np.isnan(times)
        if first_missing is None and missing.any():
            first_missing = int(df["_line"].iloc[int(np.flatnonzero(missing)[0])])
        user_parts.append(users.encode(df[ui]))
        item_parts.append(items.encode(df[ii]))
        time_parts.append(times)
        del df
    all_times = np.concatenate(time_parts)
    del time_parts
    if not len(all_times) and (share is None or share.world == 1):
        raise DataFormatError(path, None, "no interactions")
    if first_missing is not None and not np.isnan(all_times).all():
        raise DataFormatError(path, first_missing, "timestamp missing where other rows have one")
    data = group_codes(
        np.concatenate(user_parts), users.ids(), np.concatenate(item_parts), items.ids(), all_times, source=str(path)
    )
    files = parquet_parts(path) if path.is_dir() else [path]
    if item_table is not None:
        files.append(item_table)
        meta = read_table(item_table)
        iid, ri = pick(meta, ITEM_COLS, item_table), pick(meta, RELEASE_COLS, item_table)
        assert iid is not None and ri is not None
        data.item_fields = describe_items(meta, iid, list_sep="|")
        present = ~meta[ri].str.strip().str.lower().isin(MISSING)
        meta = meta[present]
        year_only = ri == "release_year"
        if year_only:
            values = numbers(meta, ri, item_table, what="release_year")
        else:
            values = unix_times(meta, ri, item_table, what="release time")
        data.release = dict(zip(meta[iid], values.astype(float).tolist(), strict=True))
        data.release_unit = ("year" if year_only else "second") if data.release else None
    data.sha256 = sha256(files)
    if cols.given():  # the same file read another way is other data
        data.sha256 = hashlib.sha256(f"{data.sha256} {cols!r}".encode()).hexdigest()
    return data


def load_interactions(
    path: Path, item_table: Path | None = None, columns: Columns | None = None, *, share: Share | None = None
) -> Interactions:
    """Detect the format of `path` (a file or a dataset folder) and load it; `columns` names a generic
    log's columns (CSV or Parquet), and a log in a known layout refuses them. `share`: only that rank's
    users' rows of a CSV or Parquet log (its item ids are then its own: `with_items` aligns them)."""
    path = Path(path)
    if share is not None and share.world > 1:
        if not (path.suffix in (".csv", ".parquet") or path.name.endswith(".csv.gz") or _is_parts(path)):
            raise DataFormatError(path, None, "ranks read their share of a CSV or Parquet log only")
        return load_table(path, item_table, columns, share=share)
    return _load(path, item_table, columns or Columns())


def _is_parts(path: Path) -> bool:
    """A folder of Parquet part files, and no file of a known layout beside them."""
    known = ("u.data", "ratings.dat", "ratings.csv")
    return (
        path.is_dir()
        and not any(path.glob("*.inter"))
        and not any((path / k).exists() for k in known)
        and bool(parquet_parts(path))
    )


def with_items(data: Interactions, item_ids: Sequence[str]) -> Interactions:
    """`data` with its items indexed into `item_ids` (a superset of its own, the same list on every
    rank), in place."""
    remap = pd.Index(item_ids).get_indexer(data.item_ids).astype(np.int32)  # -1: not in item_ids
    if (remap < 0).any():
        missing = data.item_ids[int(np.flatnonzero(remap < 0)[0])]
        raise ValueError(f"item {missing!r} is not in the shared item list")
    data.items = remap[data.items] if len(data.items) else data.items
    data.item_ids = list(item_ids)
    return data


def _load(path: Path, item_table: Path | None, columns: Columns) -> Interactions:
    if path.is_dir():
        inters = sorted(path.glob("*.inter"))
        if inters:
            return load_recbole(_known_layout(inters[0], columns))
        if (path / "u.data").exists():
            return load_grouplens_100k(_known_layout(path, columns))
        if (path / "ratings.dat").exists():
            return load_grouplens_dat(_known_layout(path, columns))
        if (path / "ratings.csv").exists():
            movies = path / "movies.csv"
            return load_movielens_csv(_known_layout(path / "ratings.csv", columns), movies if movies.exists() else None)
        if parquet_parts(path):  # a table written as part files (Spark, Dask, DuckDB)
            return load_table(path, item_table, columns)
        raise DataFormatError(
            path, None, "no known interaction file (*.inter, u.data, ratings.dat, ratings.csv, Parquet part files)"
        )
    if not path.exists():
        raise DataFormatError(path, None, "no such file")
    if path.suffix == ".inter":
        return load_recbole(_known_layout(path, columns))
    if path.suffix in (".csv", ".parquet") or path.name.endswith(".csv.gz"):
        return load_table(path, item_table, columns)
    return load_user_item_lines(_known_layout(path, columns))


def _known_layout(path: Path, columns: Columns) -> Path:
    """`path`, a log in a layout of its own: column names given for it would be ignored, so they stop the load."""
    if columns.given():
        raise DataFormatError(path, None, "column names (data.*_column, data.events) apply to a CSV or Parquet log")
    return path
