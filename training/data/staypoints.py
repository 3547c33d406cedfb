"""Staypoint tables and the MHSA next-location protocol (mie-lab/location-prediction).

1. sort by user, start_day, start_min; cap duration at 2879 minutes;
2. per user, split by day: start_day < 0.6*max_day train, < 0.8*max_day validation, rest test;
3. encode location ids on the train split only (known ids 2.., unseen 1, padding 0);
4. a sample is each staypoint at least 7 days after the user's first day in its split, with the
   earlier staypoints of the same split in the previous 7 days as history, at least 3 of them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from models.features import MAX_DURATION_MINUTES, from_times
from models.ids import IdMap
from training.data.interactions import DataFormatError, read_table

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


def _int(value: str, path: Path, line: int, name: str, lo: int, hi: int | None = None) -> int:
    try:
        v = float(value)
    except ValueError:
        raise DataFormatError(path, line, f"{name} {value!r} is not a number") from None
    if v != int(v) or v < lo or (hi is not None and v > hi):
        bound = f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}"
        raise DataFormatError(path, line, f"{name} {value!r} must be {bound}")
    return int(v)


def _parse_time(value: str, path: Path, line: int, name: str) -> dt.datetime:
    try:
        t = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise DataFormatError(path, line, f"{name} {value!r} is not an ISO 8601 time") from None
    return t


def load_staypoints(path: Path) -> StaypointData:
    """Read a staypoint table (CSV or Parquet): the GeoLife columns, or started_at/finished_at."""
    header, rows = read_table(path)  # CSV or Parquet; checks the field count of every row
    col = {name: i for i, name in enumerate(header)}
    if all(c in col for c in GEOLIFE_COLUMNS):
        mode = "geolife"
    elif all(c in col for c in TIMESTAMP_COLUMNS):
        mode = "timestamps"
    else:
        raise DataFormatError(
            path, 1, f"needs columns {list(GEOLIFE_COLUMNS)} or {list(TIMESTAMP_COLUMNS)}; got {header}"
        )
    points: list[Staypoint] = []
    raw_times: list[tuple[int, dt.datetime, dt.datetime]] = []
    for n, values in rows:
        row = ["" if v is None else str(v) for v in values]
        user, loc = row[col["user_id"]].strip(), row[col["location_id"]].strip()
        if not user or not loc:
            raise DataFormatError(path, n, "empty user_id or location_id")
        if mode == "geolife":
            points.append(
                Staypoint(
                    user, loc,
                    day=_int(row[col["start_day"]], path, n, "start_day", 0),
                    start_min=_int(row[col["start_min"]], path, n, "start_min", 0, 1439),
                    duration=min(int(_float_nonneg(row[col["duration"]], path, n)), MAX_DURATION_MINUTES),
                    weekday=_int(row[col["weekday"]], path, n, "weekday", 0, 6),
                )
            )
        else:
            start = _parse_time(row[col["started_at"]], path, n, "started_at")
            end = _parse_time(row[col["finished_at"]], path, n, "finished_at")
            if end < start:
                raise DataFormatError(path, n, "finished_at is before started_at")
            raw_times.append((len(points), start, end))
            points.append(Staypoint(user, loc, 0, 0, 0, 0))
    first_day: dict[str, dt.date] = {}
    for idx, start, _ in raw_times:
        p = points[idx]
        first_day[p.user] = min(first_day.get(p.user, start.date()), start.date())
    for idx, start, end in raw_times:
        p = points[idx]
        p.day = (start.date() - first_day[p.user]).days
        p.start_min, p.weekday, duration = from_times(start, end)
        p.duration = min(duration, MAX_DURATION_MINUTES)
    if not points:
        raise DataFormatError(path, None, "no staypoints")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return StaypointData(points, str(path), digest)


def _float_nonneg(value: str, path: Path, line: int) -> float:
    try:
        v = float(value)
    except ValueError:
        raise DataFormatError(path, line, f"duration {value!r} is not a number") from None
    if v < 0:
        raise DataFormatError(path, line, f"duration {value!r} is negative")
    return v


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
        getattr(split, name).extend(
            s for pts in parts[name] for s in samples(pts, previous_days, min_history)
        )
    return split
