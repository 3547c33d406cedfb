"""Staypoint tables and the MHSA next-location protocol (mie-lab/location-prediction).

1. sort by user, start_day, start_min; cap duration at 2879 minutes;
2. per user, split by day: start_day < 0.6*max_day train, < 0.8*max_day validation, rest test;
3. encode location ids on the train split only (known ids 2.., unseen 1, padding 0);
4. a sample is each staypoint at least 7 days after the user's first day in its split, with the
   earlier staypoints of the same split in the previous 7 days as history, at least 3 of them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from models.features import MAX_DURATION_MINUTES, from_times
from models.ids import IdMap
from training.data.tables import DataFormatError, numbers, read_table, require_ids, sha256

GEOLIFE_COLUMNS = ("user_id", "location_id", "start_day", "start_min", "duration", "weekday")
TIMESTAMP_COLUMNS = ("user_id", "location_id", "started_at", "finished_at")


@dataclass
class Staypoint:
    user: str
    location: str
    day: int  # days since the user's first record
    start_min: int  # minute of the day, 0..1439
    duration: int  # minutes, capped
    weekday: int  # 0 = Monday


@dataclass
class Sample:
    user: str
    history: list[Staypoint]
    target: Staypoint


@dataclass
class StaypointData:
    points: list[Staypoint]
    source: str = ""
    sha256: str = ""


@dataclass
class ProtocolSplit:
    locations: IdMap  # fitted on the train split
    users: IdMap
    train: list[Sample] = field(default_factory=list)
    valid: list[Sample] = field(default_factory=list)
    test: list[Sample] = field(default_factory=list)


def _ints(df: pd.DataFrame, col: str, path: Path, *, lo: int, hi: int | None = None) -> np.ndarray:
    """A column of integers in [lo, hi]; the first value that is not stops with its line."""
    v = numbers(df, col, path, what=col)
    bad = (v != np.floor(v)) | (v < lo) | ((v > hi) if hi is not None else False)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        bound = f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}"
        raise DataFormatError(path, int(df["_line"].iloc[i]), f"{col} {df[col].iloc[i]!r} must be {bound}")
    return v.astype(np.int64)


def _times(df: pd.DataFrame, col: str, path: Path) -> pd.Series:
    """ISO 8601 times, each kept in its own offset (the time of day is read where the stay was)."""
    out = []
    for value, line in zip(df[col], df["_line"], strict=True):
        try:
            out.append(dt.datetime.fromisoformat(value.strip()))
        except ValueError:
            raise DataFormatError(path, int(line), f"{col} {value!r} is not an ISO 8601 time") from None
    return pd.Series(out, index=df.index, dtype=object)


def load_staypoints(path: Path) -> StaypointData:
    """Read a staypoint table (CSV or Parquet): the GeoLife columns, or started_at/finished_at."""
    df = read_table(path)
    if all(c in df.columns for c in GEOLIFE_COLUMNS):
        mode = "geolife"
    elif all(c in df.columns for c in TIMESTAMP_COLUMNS):
        mode = "timestamps"
    else:
        header = [c for c in df.columns if c != "_line"]
        raise DataFormatError(
            path, 1, f"needs columns {list(GEOLIFE_COLUMNS)} or {list(TIMESTAMP_COLUMNS)}; got {header}"
        )
    if df.empty:
        raise DataFormatError(path, None, "no staypoints")
    df["user_id"], df["location_id"] = df["user_id"].str.strip(), df["location_id"].str.strip()
    require_ids(df, ("user_id", "location_id"), path)
    users, locations = df["user_id"].tolist(), df["location_id"].tolist()
    if mode == "geolife":
        day = _ints(df, "start_day", path, lo=0)
        start = _ints(df, "start_min", path, lo=0, hi=1439)
        weekday = _ints(df, "weekday", path, lo=0, hi=6)
        duration = numbers(df, "duration", path, what="duration")
        if (duration < 0).any():
            i = int(np.flatnonzero(duration < 0)[0])
            raise DataFormatError(path, int(df["_line"].iloc[i]), f"duration {df['duration'].iloc[i]!r} is negative")
        capped = np.minimum(duration.astype(np.int64), MAX_DURATION_MINUTES)
        points = [
            Staypoint(u, loc, int(d), int(m), int(c), int(w))
            for u, loc, d, m, c, w in zip(users, locations, day, start, capped, weekday, strict=True)
        ]
    else:
        starts, ends = _times(df, "started_at", path), _times(df, "finished_at", path)
        first_day: dict[str, dt.date] = {}
        for u, t in zip(users, starts, strict=True):
            first_day[u] = min(first_day.get(u, t.date()), t.date())
        points = []
        for u, loc, t0, t1, line in zip(users, locations, starts, ends, df["_line"], strict=True):
            if t1 < t0:
                raise DataFormatError(path, int(line), "finished_at is before started_at")
            start_min, wd, duration_min = from_times(t0, t1)
            points.append(
                Staypoint(
                    u, loc, (t0.date() - first_day[u]).days, start_min, min(duration_min, MAX_DURATION_MINUTES), wd
                )
            )
    return StaypointData(points, str(path), sha256([path]))


def split_by_day(points: list[Staypoint]) -> dict[str, list[list[Staypoint]]]:
    """Per user, the 60/20/20 split by day. -> {"train"|"valid"|"test": [user's points, ...]}."""
    by_user: dict[str, list[Staypoint]] = {}
    for p in points:
        by_user.setdefault(p.user, []).append(p)
    out: dict[str, list[list[Staypoint]]] = {"train": [], "valid": [], "test": []}
    for user in sorted(by_user, key=_user_order):
        pts = sorted(by_user[user], key=lambda p: (p.day, p.start_min))
        max_day = max(p.day for p in pts)
        parts: dict[str, list[Staypoint]] = {"train": [], "valid": [], "test": []}
        for p in pts:
            part = "train" if p.day < 0.6 * max_day else "valid" if p.day < 0.8 * max_day else "test"
            parts[part].append(p)
        for k in out:
            out[k].append(parts[k])
    return out


def _user_order(u: str) -> tuple[int, int | str]:
    return (0, int(u)) if u.lstrip("-").isdigit() else (1, u)


def samples(user_points: list[Staypoint], previous_days: int = 7, min_history: int = 3) -> list[Sample]:
    """Samples of one user's points in one split (sorted by day and minute)."""
    if not user_points:
        return []
    first = user_points[0].day
    out = []
    for i, p in enumerate(user_points):
        if p.day - first < previous_days:
            continue
        hist = [h for h in user_points[:i] if h.day >= p.day - previous_days]
        if len(hist) >= min_history:
            out.append(Sample(p.user, hist, p))
    return out


def build_protocol(data: StaypointData, previous_days: int = 7, min_history: int = 3) -> ProtocolSplit:
    parts = split_by_day(data.points)
    # Known locations are indexed in sorted raw-id order, as the reference's OrdinalEncoder does.
    train_locs = sorted({p.location for pts in parts["train"] for p in pts}, key=_user_order)
    users = sorted({p.user for p in data.points}, key=_user_order)
    split = ProtocolSplit(IdMap(train_locs), IdMap(users))
    for name in ("train", "valid", "test"):
        getattr(split, name).extend(s for pts in parts[name] for s in samples(pts, previous_days, min_history))
    return split
