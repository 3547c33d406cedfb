"""The store interface, the event and its outcomes, and the helpers both stores share."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from models.engine import LIVE_EVENTS, RecentEvent, Timeline

log = logging.getLogger(__name__)
T = TypeVar("T")
# "conflict": the id was stored with another payload. When any event of a call conflicts, the call
# stores nothing: the conflicting ones say "conflict", the others "skipped". "dropped_old": taken (its
# id is known from now on) but older than the `keep` newest of its user, so not kept.
Outcome = Literal["stored", "duplicate", "conflict", "skipped", "dropped_old"]
# Live events of all users one query reads for recent activity, at most (a day of a busy network):
# beyond it the newest are counted and a warning logged.
RECENT_EVENTS = 200_000
# The Redis store keeps every user's events of this long before its newest in a per-namespace set for
# recent activity (SQLite reads them from its events table): a model's windows must fit in it
# (SEQSERVE_RECENT_KEEP_S; a model whose longest window is longer is logged at load).
RECENT_KEEP_S = 7 * 24 * 3600.0
# A user -> the artifact's events of that user as (raw id, time or None) keys.
StoredEvents = Callable[[str], set[tuple[str | None, float | None]]]
# Arrivals (own events in the order the store took them, for online evaluation) are kept this long:
# every worker reads them every SEQSERVE_ONLINE_SCORE_S and starts from "now", so what is older has
# been read by every live worker (a day of a busy service would be tens of millions of rows).
ARRIVALS_KEEP_S = 900.0
# Online evaluation sums per (model, version, variant, bucket start): buckets older than this are dropped.
ONLINE_KEEP_S = 30 * 24 * 3600.0
Mode = Literal["canary", "shadow"]
Variant = Literal["live", "canary", "shadow"]


@dataclass(frozen=True)
class Event:
    event_id: str
    user_id: str
    item_id: str
    timestamp: float  # unix seconds; NaN when the data has no times
    action: str | None = None
    received: bool = False  # a step another user's event adds to this user's timeline (capped apart)

    @property
    def digest(self) -> str:
        """Identifies the payload, so a reused event id with another payload is recognised."""
        payload = json.dumps([self.user_id, self.item_id, json_ts(self.timestamp), self.action])
        return hashlib.sha256(payload.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Candidate:
    """A version of a model tried beside the live one: `canary` answers `share` of the users (sticky
    by user id); `shadow` scores the same by-user queries off the response path. `since`: when it
    became the candidate (its online figures are compared with the live version's from then on)."""

    version: str
    mode: Mode
    share: float
    since: float
    outcome: str | None = None  # "promoted" or "retired" once the trial ended; None while it runs

    @property
    def running(self) -> bool:
        return self.outcome is None

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "mode": self.mode,
                "share": self.share,
                "since": self.since,
                "outcome": self.outcome,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Candidate:
        raw = json.loads(text)
        mode = raw["mode"]
        if mode not in ("canary", "shadow"):
            raise ValueError(f"unknown candidate mode {mode!r}")
        return cls(str(raw["version"]), mode, float(raw["share"]), float(raw["since"]), raw.get("outcome"))


@dataclass(frozen=True)
class Arrival:
    """A user's own event as the store took it: what scores the lists served to that user before `at`
    (the server's clock when it was stored, not the event's own time)."""

    namespace: str
    user: str
    item: str
    at: float


@dataclass
class Sums:
    """Online evaluation sums of scored lists: count, hits@10, NDCG@10 (and its square, for the
    interval), reciprocal rank."""

    n: float = 0.0
    hits: float = 0.0
    ndcg: float = 0.0
    ndcg2: float = 0.0
    rr: float = 0.0

    FIELDS = ("n", "hits", "ndcg", "ndcg2", "rr")

    def add(self, other: Sums) -> None:
        for f in self.FIELDS:
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def values(self) -> tuple[float, ...]:
        return tuple(getattr(self, f) for f in self.FIELDS)


@dataclass
class UserStats:
    """One side of a trial with the user as the unit, as running sums over its users u of (lists k_u,
    NDCG@10 sum s_u): the promotion rule's clustered variance needs no more (app.online.clustered), so
    the store keeps these up to date as per-user sums grow instead of the rule reading every user."""

    users: int = 0
    n: float = 0.0  # sum of k_u
    s: float = 0.0  # sum of s_u
    nn: float = 0.0  # sum of k_u^2
    ss: float = 0.0  # sum of s_u^2
    ns: float = 0.0  # sum of k_u s_u

    FIELDS = ("users", "n", "s", "nn", "ss", "ns")

    def move(self, old: tuple[float, float] | None, new: tuple[float, float]) -> None:
        """A user's sums went from `old` (None: a user new to this side) to `new`."""
        (k0, s0), (k1, s1) = old or (0.0, 0.0), new
        self.users += old is None
        self.n += k1 - k0
        self.s += s1 - s0
        self.nn += k1 * k1 - k0 * k0
        self.ss += s1 * s1 - s0 * s0
        self.ns += k1 * s1 - k0 * s0

    @classmethod
    def of(cls, users: Sequence[tuple[float, float]]) -> UserStats:
        out = cls()
        for pair in users:
            out.move(None, pair)
        return out

    def values(self) -> tuple[float, ...]:
        return tuple(float(getattr(self, f)) for f in self.FIELDS)


# (model name, version, variant, bucket start in unix seconds)
OnlineKey = tuple[str, str, str, float]
# (model name, trial start, version, variant, user): a trial's scored lists per user, for the rule
UserKey = tuple[str, float, str, str, str]


class StoreError(RuntimeError):
    """The store could not be reached or refused a write: nothing of the call was stored.

    The message is for logs (it may name a file or host); clients get a fixed one.
    """


# Query parameters of a Redis URL that carry no secret; every other value (password=..., which
# redis-py accepts, or anything a later client version reads) is masked in logs.
_PLAIN_PARAMS = frozenset(
    {
        "db",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "retry_on_timeout",
        "health_check_interval",
        "protocol",
        "decode_responses",
        "ssl_cert_reqs",
        "client_name",
    }
)


def redact(url: str) -> str:
    """A URL without its password (in the user part or the query string), for logs."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{port}" if port else "")
    query = (
        "&".join(
            p if p.split("=", 1)[0].lower() in _PLAIN_PARAMS or "=" not in p else f"{p.split('=', 1)[0]}=***"
            for p in parts.query.split("&")
        )
        if parts.query
        else ""
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def nan_ts(t: float | None) -> float:
    return math.nan if t is None else float(t)


def json_ts(t: float) -> float | None:
    return None if math.isnan(t) else t


def event_key(item: str, t: float) -> tuple[str | None, float | None]:
    return item, json_ts(t)


class HistoryStore(ABC):
    """Per-namespace live user events, appended after an artifact's final histories."""

    kind: str
    # Whether reads are quick local calls (SQLite's WAL readers never wait on a writer) that may run
    # on the event loop when small; a network store's reads always go to a worker thread.
    local_reads: bool = False
    # How far back `recent` reaches before the newest event; None: as far as the kept events go.
    recent_horizon_s: float | None = None

    def __init__(self, keep: int = LIVE_EVENTS) -> None:
        self.keep = keep  # live events kept per user

    @abstractmethod
    def drop_trained_events(self, namespace: str, data_hash: str, stored: StoredEvents) -> int | None:
        """Drop the live events that `stored` says the artifact of `data_hash` was trained on, unless
        that data hash was handled already (None). Walks the users with live events only; their ids stay known.
        Returns how many events it dropped."""

    @abstractmethod
    def append(self, namespace: str, events: Sequence[Event]) -> list[Outcome]:
        """Store events durably; per event, whether it was stored or a duplicate. If any event reuses a
        stored id with another payload, nothing is stored (see Outcome)."""

    @abstractmethod
    def events(self, namespace: str, users: Sequence[str], limit: int | None = None) -> dict[str, Timeline]:
        """The newest `limit` (default: all kept) live events of each kind (own, received) of each user
        that has any, merged, oldest first (by timestamp, then arrival)."""

    @abstractmethod
    def recent(self, namespace: str, *, start: float, end: float, limit: int = RECENT_EVENTS) -> list[RecentEvent]:
        """Every user's own live events (not the steps others' events added) with start <= time < end, the
        newest `limit` of them, oldest first."""

    @abstractmethod
    def users(self, namespace: str) -> Iterator[str]:
        """Every user with live events."""

    @abstractmethod
    def pins(self) -> dict[str, str]:
        """Model name -> the version an admin pinned it to; every worker and host sharing the store sees them."""

    @abstractmethod
    def set_pin(self, name: str, version: str | None) -> None:
        """Pin `name` to `version`, durably; None removes the pin (back to the newest that loads)."""

    @abstractmethod
    def arrivals(self, cursor: str | None, limit: int = 10_000) -> tuple[str, list[Arrival]]:
        """Own events stored after `cursor`, in arrival order, at most `limit`, and the cursor to read on
        from; None: nothing, and the cursor of the newest (a worker starts reading from now)."""

    @abstractmethod
    def add_online(self, sums: Mapping[OnlineKey, Sums]) -> None:
        """Add a worker's online evaluation sums to the shared totals (and drop buckets past ONLINE_KEEP_S)."""

    @abstractmethod
    def online(self, name: str) -> dict[OnlineKey, Sums]:
        """The shared online evaluation totals of model `name`, per version, variant and bucket."""

    @abstractmethod
    def add_user_sums(self, sums: Mapping[UserKey, Sequence[float]]) -> None:
        """Add per-user (lists, NDCG@10 sum) of a trial to the shared ones, and move its sides' UserStats."""

    @abstractmethod
    def trial_stats(self, name: str, trial: float) -> dict[tuple[str, str], UserStats]:
        """(version, variant) -> its users' running sums since the trial of `name` that began at `trial`:
        kept up to date by `add_user_sums`, so reading them costs the same at 30 users and at 200,000."""

    @abstractmethod
    def candidates(self) -> dict[str, Candidate]:
        """Model name -> its last candidate: the version on trial beside its live one, or the trial that
        ended last (its outcome set), so a retired version is not tried again."""

    @abstractmethod
    def set_candidate(self, name: str, candidate: Candidate | None) -> None:
        """Try `candidate` beside the live version of `name`, durably; None forgets the name's trials.
        The per-user sums of its earlier trials are dropped."""

    @abstractmethod
    def settle(self, name: str, version: str, *, promote: bool) -> bool:
        """End the running trial of `version` of `name` in one write: its outcome set and, when `promote`,
        the name pinned to it. False (nothing written) when that trial is not running."""

    @abstractmethod
    def expire(self, *, now: float) -> None:
        """Drop what is past its keep time; every housekeeping tick calls it, with or without events."""

    @abstractmethod
    def ping(self) -> None:
        """Raise StoreError when the store cannot be used."""

    @abstractmethod
    def close(self) -> None: ...
