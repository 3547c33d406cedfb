"""Reading tabular files with pandas, every defect reported with the file, the line and the problem."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# Spellings of a missing value seen in real item tables (ml-100k writes "unkonwn").
MISSING = frozenset({"", "unknown", "unkonwn", "nan", "none", "null", "na", "n/a"})
_LINE = re.compile(r"line (\d+)")


class DataFormatError(ValueError):
    """A malformed input file: names the file, the line and what is wrong."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = str(path), line


def sha256(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def read_text_table(
    path: Path,
    *,
    sep: str,
    names: Sequence[str] | None = None,
    encoding: str = "utf-8",
    expect: str | None = None,
) -> pd.DataFrame:
    """Every field as a string, for unquoted formats (tab, whitespace, "::", "|"); blank lines skipped.
    `names` given: no header line. A line with another number of fields than the header (or `names`)
    stops with its number; `expect` describes the line format in that message. The frame's `_line`
    column holds each row's line number. (Quoted CSV goes through table_chunks.)"""
    if not path.is_file():
        raise DataFormatError(path, None, "no such file")
    try:
        lines = pd.Series(path.read_text(encoding=encoding).split("\n"), dtype=str).str.rstrip("\r")
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, None, f"not {encoding} text ({exc.reason})") from None
    numbers_ = np.arange(len(lines)) + 1
    keep = (lines.str.strip() != "").to_numpy()
    lines, numbers_ = lines[keep], numbers_[keep]
    if names is None:
        if lines.empty:
            raise DataFormatError(path, 1, "empty file")
        names = _split(lines.iloc[:1], sep).iloc[0]
        lines, numbers_ = lines.iloc[1:], numbers_[1:]
    parts = _split(lines, sep)
    counts = parts.str.len().to_numpy()
    bad = counts != len(names)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        kind = "tab-separated " if sep == "\t" else ""
        detail = f"expected {expect}" if expect else f"expected {len(names)} {kind}fields"
        raise DataFormatError(path, int(numbers_[i]), f"{detail}, got {int(counts[i])}")
    df = (
        pd.DataFrame(parts.tolist(), columns=list(names), dtype=str)
        if len(parts)
        else pd.DataFrame(columns=list(names), dtype=str)
    )
    df["_line"] = numbers_
    return df


def _split(lines: pd.Series, sep: str) -> pd.Series:
    if sep == r"\s+":
        return lines.str.strip().str.split()
    return lines.str.split(sep, regex=False)


CHUNK_ROWS = 2_000_000  # rows per chunk of a large table: what one chunk's strings hold at once


def _csv_error(path: Path, exc: Exception) -> DataFormatError:
    if isinstance(exc, pd.errors.EmptyDataError):
        return DataFormatError(path, 1, "empty file")
    if isinstance(exc, pd.errors.ParserError):
        m, want, got = _LINE.search(str(exc)), re.search(r"Expected (\d+)", str(exc)), re.search(r"saw (\d+)", str(exc))
        detail = f"expected {want.group(1)} fields" if want else "malformed CSV"
        return DataFormatError(path, int(m.group(1)) if m else None, detail + (f", got {got.group(1)}" if got else ""))
    if isinstance(exc, UnicodeDecodeError):
        return DataFormatError(path, None, f"not UTF-8 text ({exc.reason})")
    # a stray quote, a truncated gzip stream
    return DataFormatError(path, None, f"unreadable table ({str(exc).splitlines()[0][:200]})")


_CSV_ERRORS = (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError, EOFError)


def _csv_chunks(path: Path, rows: int) -> Iterator[pd.DataFrame]:
    """A quoted CSV (optionally gzip-compressed) read by pandas' C parser; an empty field is ""."""
    try:
        reader = pd.read_csv(
            path,
            dtype=str,
            keep_default_na=False,
            na_values=[],
            skip_blank_lines=True,
            compression="infer",
            chunksize=rows,
        )
        # Row numbers as a CSV reader counts lines (exact unless a quoted field spans lines).
        line = 2
        with reader:
            for df in reader:
                df["_line"] = np.arange(line, line + len(df))
                line += len(df)
                yield df
    except _CSV_ERRORS as exc:
        raise _csv_error(path, exc) from None


def parquet_parts(folder: Path) -> list[Path]:
    """The part files of a Parquet folder as Spark, Dask or DuckDB write one (partition folders
    included; `_SUCCESS`, `.crc` and other hidden files left out, as pyarrow does)."""
    return sorted(
        p
        for p in folder.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(folder).parts)
    )


def _parquet_chunks(path: Path, rows: int) -> Iterator[pd.DataFrame]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # optional dependency
        raise DataFormatError(path, None, "reading Parquet needs the 'parquet' extra (pyarrow)") from None
    line = 2  # rows count from 2, as a CSV reader's lines would, across a folder's parts in name order
    for part in parquet_parts(path) if path.is_dir() else [path]:
        try:
            file = pq.ParquetFile(part)
            if file.metadata.num_rows == 0:  # an empty table still names its columns
                yield pd.DataFrame(
                    {name: pd.Series([], dtype=str) for name in file.schema_arrow.names}
                    | {"_line": np.zeros(0, np.int64)}
                )
                continue
            for batch in file.iter_batches(batch_size=rows):
                df = pd.DataFrame(
                    {name: _strings(col) for name, col in zip(batch.schema.names, batch.columns, strict=True)}
                )
                df["_line"] = np.arange(line, line + len(df))
                line += len(df)
                yield df
        except Exception as exc:  # a corrupt or foreign file
            raise DataFormatError(path, None, f"not a readable Parquet file ({type(exc).__name__})") from None


def _strings(col: Any) -> pd.Series:
    """An Arrow column as the strings a CSV would hold ("" for null). Strings and integers are
    converted by Arrow; other types (floats, timestamps) value by value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_integer(col.type) or pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return pc.fill_null(pc.cast(col, pa.string()), "").to_pandas()
    values = pd.Series(col.to_pandas(), dtype=object)
    return values.where(values.notna(), "").map(_text).astype(str)


def table_chunks(path: Path, rows: int | None = None) -> Iterator[pd.DataFrame]:
    """A CSV (optionally gzip-compressed) or Parquet table, or a folder of Parquet part files, in
    chunks of at most `rows` rows: every column as strings, with `_line` numbers as a CSV reader
    would count them (`rows`: CHUNK_ROWS unless given)."""
    rows = rows or CHUNK_ROWS
    if path.is_dir() and parquet_parts(path):
        return _parquet_chunks(path, rows)
    if not path.is_file():
        raise DataFormatError(path, None, "no such file")
    return _csv_chunks(path, rows) if is_csv(path) else _parquet_chunks(path, rows)


def is_csv(path: Path) -> bool:
    """Whether table_chunks reads `path` as CSV text (else Parquet)."""
    return not (path.is_dir() or path.suffix == ".parquet")


def read_table(path: Path) -> pd.DataFrame:
    """The whole of a table_chunks() table in one frame."""
    chunks = list(table_chunks(path))
    return pd.concat(chunks, ignore_index=True) if len(chunks) != 1 else chunks[0]


def _text(v: Any) -> str:
    if isinstance(v, pd.Timestamp):
        return v.isoformat()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def pick(df: pd.DataFrame, candidates: Sequence[str], path: Path, *, required: bool = True) -> str | None:
    for name in candidates:
        if name in df.columns:
            return name
    if required:
        header = [c for c in df.columns if c != "_line"]
        raise DataFormatError(path, 1, f"no column among {list(candidates)} in header {header}")
    return None


def numbers(df: pd.DataFrame, col: str, path: Path, *, what: str, allow_missing: bool = False) -> np.ndarray:
    """A column as float64; the first value that is not a number stops with its line."""
    values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64, copy=True)
    bad = np.isnan(values) & ~(df[col].str.strip().str.lower().isin(MISSING).to_numpy() & allow_missing)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataFormatError(path, int(df["_line"].iloc[i]), f"{what} {df[col].iloc[i]!r} is not a number")
    return values


def unix_times(
    df: pd.DataFrame, col: str, path: Path, *, what: str, allow_missing: bool = False, per_second: float = 1.0
) -> np.ndarray:
    """Unix seconds from numbers (`per_second` of them a second: 1000 for milliseconds) or ISO 8601
    texts (UTC when no zone is given); NaN where allowed missing."""
    text = df[col].str.strip()
    values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64, copy=True) / per_second
    todo = np.isnan(values) & (text != "").to_numpy()
    if todo.any():
        parsed = pd.to_datetime(text[todo], errors="coerce", utc=True, format="ISO8601")
        secs = (parsed - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(dtype=np.float64)
        values[todo] = secs
    bad = np.isnan(values) & ~((text == "").to_numpy() & allow_missing)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataFormatError(
            path, int(df["_line"].iloc[i]), f"{what} {df[col].iloc[i]!r} is neither unix seconds nor ISO 8601"
        )
    return values


def require_ids(df: pd.DataFrame, cols: Sequence[str], path: Path) -> None:
    for col in cols:
        empty = (df[col].str.strip() == "").to_numpy()
        if empty.any():
            i = int(np.flatnonzero(empty)[0])
            raise DataFormatError(path, int(df["_line"].iloc[i]), f"empty {col}")
