"""The production state interface: what the production loop keeps beside the histories and shares
across workers and hosts: version pins, candidates and their trials, the arrivals log online
evaluation reads, and the online sums."""

from __future__ import annotations

import dataclasses
import json
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from app.store.base import Store

# Arrivals (own events in the order the store took them, for online evaluation) are kept this long:
# every worker reads them every SEQSERVE_ONLINE_SCORE_S and starts from "now", so what is older has
# been read by every live worker (a day of a busy service would be tens of millions of rows).
ARRIVALS_KEEP_S = 900.0
# Online evaluation sums per (model, version, variant, bucket start): buckets older than this are dropped.
ONLINE_KEEP_S = 30 * 24 * 3600.0
# Exposure per (model, version, variant, bucket start), with the items each showed: kept for the longest
# online window (a day, SEQSERVE_ONLINE_WINDOW_S) and one bucket, so a catalog's items are held at most
# once per bucket of a day.
EXPOSURE_BUCKET_S = 600.0
EXPOSURE_KEEP_S = 24 * 3600.0 + EXPOSURE_BUCKET_S
Mode = Literal["canary", "shadow", "interleave"]  # a trial's: what an admin or a new version starts
# "floor": the live version's reference lists (its own popularity, with the same exclusions) scored on the
# same events as its answers: the figure probation and the floor alert compare it with (app/production/online.py).
Variant = Literal["live", "canary", "shadow", "interleave", "holdback", "floor"]


def segment_of(*, known_user: bool, fresh: bool, fallback: bool = False) -> str:
    """A served list's segment: whether the serving version's artifact held its user ("known"), the user
    is known from live events only ("new"), or the version did not know the user and a fallback answered
    ("fallback"); and whether it holds an item first seen live ("+fresh")."""
    users = "fallback" if fallback else "known" if known_user else "new"
    return users + ("+fresh" if fresh else "")


def segment_parts(segment: str) -> tuple[str, str] | None:
    """A segment's users ("known", "new") and items ("fresh", "catalog"); None for sums kept before segments."""
    if not segment:
        return None
    users, _, fresh = segment.partition("+")
    return users, "fresh" if fresh else "catalog"


def segment_groups(segment: str) -> tuple[str, str] | None:
    """The groups a segment's lists are shown in, one of users and one of lists: users_known, users_new or
    users_fallback, lists_fresh or lists_catalog."""
    parts = segment_parts(segment)
    return None if parts is None else (f"users_{parts[0]}", f"lists_{parts[1]}")


@dataclass(frozen=True)
class TrialEnd:
    """A trial's record once it ended: `outcome` ("promoted", "retired", "rolled_back") and when; for a
    promotion, the version it replaced (probation's comparison and a rollback's pin) and when probation
    confirmed it."""

    outcome: str
    ended: float | None = None
    replaced: str | None = None
    confirmed: float | None = None


@dataclass(frozen=True)
class Candidate:
    """A version of a model on trial beside the live one: `canary` answers `share` of the users (sticky
    by user id); `shadow` scores the same by-user queries off the response path; `interleave` mixes its
    list with the live one in every by-user answer (app/production/interleave.py). `since`: when it became
    the candidate (its online figures are compared with the live version's from then on). `end`: the trial's
    record once it ended (None while it runs); a promoted candidate is on probation until it is confirmed or
    rolled back. (The version a promotion replaced, answering beside it during probation, is not a
    candidate: app.choices.Holdback.)"""

    version: str
    mode: Mode
    share: float
    since: float
    end: TrialEnd | None = None

    @property
    def outcome(self) -> str | None:
        return self.end.outcome if self.end is not None else None

    @property
    def ended(self) -> float | None:
        return self.end.ended if self.end is not None else None

    @property
    def replaced(self) -> str | None:
        return self.end.replaced if self.end is not None else None

    @property
    def confirmed(self) -> float | None:
        return self.end.confirmed if self.end is not None else None

    def settled(self, *, promoted: bool, at: float, replaced: str | None) -> Candidate:
        """The record of the trial ended now: promoted (replacing `replaced`) or retired."""
        return dataclasses.replace(self, end=TrialEnd("promoted" if promoted else "retired", at, replaced))

    def rolled_back(self) -> Candidate:
        """The promotion's record, rolled back (a running trial has none to change: itself)."""
        return (
            self
            if self.end is None
            else dataclasses.replace(self, end=dataclasses.replace(self.end, outcome="rolled_back"))
        )

    def confirmed_at(self, at: float) -> Candidate:
        """The promotion's record, confirmed at `at` (a running trial has none to change: itself)."""
        if self.end is None:
            return self
        return dataclasses.replace(self, end=dataclasses.replace(self.end, confirmed=at))

    @property
    def running(self) -> bool:
        return self.outcome is None

    @property
    def variant(self) -> Mode:
        """The online side its lists are scored as: its mode."""
        return self.mode

    @property
    def on_probation(self) -> bool:
        """Promoted, and its probation not ended yet: neither confirmed nor rolled back."""
        return self.outcome == "promoted" and self.confirmed is None

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "mode": self.mode,
                "share": self.share,
                "since": self.since,
                "outcome": self.outcome,
                "ended": self.ended,
                "replaced": self.replaced,
                "confirmed": self.confirmed,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Candidate:
        raw = json.loads(text)
        mode = raw["mode"]
        if mode not in ("canary", "shadow", "interleave"):
            raise ValueError(f"unknown candidate mode {mode!r}")
        ended, confirmed, outcome = raw.get("ended"), raw.get("confirmed"), raw.get("outcome")
        end = None
        if outcome is not None:
            end = TrialEnd(
                str(outcome),
                None if ended is None else float(ended),
                raw.get("replaced"),
                None if confirmed is None else float(confirmed),
            )
        return cls(str(raw["version"]), mode, float(raw["share"]), float(raw["since"]), end)


@dataclass(frozen=True)
class RetrainRecord:
    """What the retrainer keeps per model in the store, beside its lease, so that a restart, an OOM kill or
    another host taking the lease over go on from it (retrainer/retrainer.py)."""

    ended: float | None = None  # when the model's last retrain ended; None before its first
    outcome: str | None = None  # published, held_back, failed, lost_lease, stopped
    base: str | None = None  # the version it started from
    in_a_row: int = 0  # runs in a row that published nothing (held back or failed): the back-off's exponent
    good: str | None = None  # the newest version found a good start (not on probation, not unfit online)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RetrainRecord:
        raw = json.loads(text)
        ended = raw.get("ended")
        return cls(
            None if ended is None else float(ended),
            None if raw.get("outcome") is None else str(raw["outcome"]),
            None if raw.get("base") is None else str(raw["base"]),
            int(raw.get("in_a_row", 0)),
            None if raw.get("good") is None else str(raw["good"]),
        )


def probation_key(spec: str | None) -> float:
    """The trial key a promoted candidate's probation keeps its per-user sums under (its promotion's
    time), from the candidate's stored spec; -1 when it is not a promotion."""
    if spec is None:
        return -1.0
    cand = Candidate.from_json(spec)
    return cand.ended if cand.outcome == "promoted" and cand.ended is not None else -1.0


@dataclass(frozen=True)
class HiddenItem:
    """An item taken out of every answer of a model (POST /admin/models/{name}/items/hide) until it is unhidden
    or `until` passes (None: until unhidden)."""

    until: float | None
    reason: str
    at: float  # when it was hidden

    def to_json(self) -> str:
        return json.dumps({"until": self.until, "reason": self.reason, "at": self.at})

    @classmethod
    def from_json(cls, text: str) -> HiddenItem:
        raw = json.loads(text)
        until = raw.get("until")
        return cls(None if until is None else float(until), str(raw.get("reason", "")), float(raw["at"]))


# Items one model may hold hidden at once: each worker reads them every housekeeping tick.
MAX_HIDDEN = 100_000
MAX_NAMED_FILTERS = 100  # named filters one model may hold


@dataclass(frozen=True)
class Arrival:
    """A user's own event as the store took it: what scores the lists served to that user before `at`
    (the server's clock when it was stored, not the event's own time)."""

    namespace: str
    user: str
    item: str
    at: float
    recommendation_id: str | None = None  # the answer the event names (POST /events), if it named one


@dataclass
class Sums:
    """Online evaluation sums of scored lists: count, hits@10, NDCG@10 (and its square, for the
    interval), reciprocal rank, and how many were scored by an event naming their recommendation_id
    (the others by the user's next event)."""

    n: float = 0.0
    hits: float = 0.0
    ndcg: float = 0.0
    ndcg2: float = 0.0
    rr: float = 0.0
    attributed: float = 0.0

    FIELDS = ("n", "hits", "ndcg", "ndcg2", "rr", "attributed")

    def add(self, other: Sums) -> None:
        for f in self.FIELDS:
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def values(self) -> tuple[float, ...]:
        return tuple(getattr(self, f) for f in self.FIELDS)


# A user's weight in a side's mean grows with their scored lists up to this many: a user seen once counts
# less than one seen ten times, and no heavy user carries a side (docs/decisions/sequential-tests.md).
WEIGHT_CAP = 10.0


@dataclass
class UserStats:
    """One side of a trial with the user as the unit, as running sums over its users u of (lists k_u,
    score sum s_u) and of each user's mean m_u = s_u / k_u weighted by w_u = min(k_u, WEIGHT_CAP): the rule's
    and probation's tests need no more (app.promotion.per_user), and the sign test the users whose s_u is
    above and below zero, so the store keeps these up to date as per-user sums grow instead of the rule
    reading every user. s_u is a sum of NDCG@10 on a canary, shadow, live or holdback side, of credits (+1
    candidate, -1 live) on an interleaved one, of a list's NDCG@10 less its reference list's on a floor side."""

    users: int = 0
    n: float = 0.0  # sum of k_u
    s: float = 0.0  # sum of s_u
    w: float = 0.0  # sum of w_u
    wm: float = 0.0  # sum of w_u m_u
    w2: float = 0.0  # sum of w_u^2
    w2m: float = 0.0  # sum of w_u^2 m_u
    w2mm: float = 0.0  # sum of w_u^2 m_u^2
    positive: int = 0  # users with s_u > 0
    negative: int = 0  # users with s_u < 0

    FIELDS = ("users", "n", "s", "w", "wm", "w2", "w2m", "w2mm", "positive", "negative")
    COUNTS = ("users", "positive", "negative")  # whole numbers

    def move(self, old: tuple[float, float] | None, new: tuple[float, float]) -> None:
        """A user's sums went from `old` (None: a user new to this side) to `new` (k > 0)."""
        (k0, s0), (k1, s1) = old or (0.0, 0.0), new
        self.users += old is None
        self.n += k1 - k0
        self.s += s1 - s0
        for k, total, sign in ((k0, s0, -1.0), (k1, s1, 1.0)):
            if k <= 0:
                continue
            w, m = min(k, WEIGHT_CAP), total / k
            self.w += sign * w
            self.wm += sign * w * m
            self.w2 += sign * w * w
            self.w2m += sign * w * w * m
            self.w2mm += sign * w * w * m * m
        self.positive += (s1 > 0) - (s0 > 0)
        self.negative += (s1 < 0) - (s0 < 0)

    @classmethod
    def of(cls, users: Sequence[tuple[float, float]]) -> UserStats:
        out = cls()
        for pair in users:
            out.move(None, pair)
        return out

    def values(self) -> tuple[float, ...]:
        return tuple(float(getattr(self, f)) for f in self.FIELDS)


@dataclass
class Exposure:
    """What one version showed users over a span (by-user lists, their top 10): how many lists and item
    slots, how many slots went to the popular head, and which items (the catalog coverage)."""

    lists: float = 0.0
    slots: float = 0.0
    head: float = 0.0
    items: set[str] = field(default_factory=set)

    def add(self, other: Exposure) -> None:
        self.lists += other.lists
        self.slots += other.slots
        self.head += other.head
        self.items |= other.items


# Traffic's latency histogram: bucket i holds answers up to LATENCY_EDGES_S[i] seconds (the last: any longer),
# 0.1 ms to about 20 s in steps of 25%, so a percentile read from it is within 25% of the true one. The
# answers are seconds per query of a request's part (app/production/traffic.py): a batched query can take
# well under 1 ms.
LATENCY_EDGES_S = tuple(0.0001 * 1.25**i for i in range(56))


@dataclass
class Traffic:
    """One version's answers over a span: how many, how many failed on its side, and their cost (seconds per
    query)."""

    n: float = 0.0
    errors: float = 0.0
    hist: dict[int, float] = field(default_factory=dict)  # LATENCY_EDGES_S's index -> answers

    def add(self, other: Traffic) -> None:
        self.n += other.n
        self.errors += other.errors
        for i, count in other.hist.items():
            self.hist[i] = self.hist.get(i, 0.0) + count

    def quantile(self, q: float) -> float | None:
        """The upper edge of the bucket holding the q-quantile of the latencies (None without answers)."""
        total = sum(self.hist.values())
        if total <= 0:
            return None
        seen = 0.0
        for i in sorted(self.hist):
            seen += self.hist[i]
            if seen >= q * total:
                return LATENCY_EDGES_S[min(i, len(LATENCY_EDGES_S) - 1)]
        return LATENCY_EDGES_S[-1]


# (model name, version, variant, bucket start in unix seconds, segment: app.online.segment_of)
OnlineKey = tuple[str, str, str, float, str]
# (model name, version, variant, bucket start in unix seconds)
ExposureKey = tuple[str, str, str, float]
# (model name, version, bucket start in unix seconds)
TrafficKey = tuple[str, str, float]
# (model name, trial start, version, variant, user): a trial's scored lists per user, for the rule
UserKey = tuple[str, float, str, str, str]


class ProductionState(Store):
    """Pins, candidates, trials, arrivals, online sums, exposure and traffic, shared by every worker and
    host of a deployment."""

    @abstractmethod
    def pins(self) -> dict[str, str]:
        """Model name -> the version an admin pinned it to; every worker and host sharing the store sees them."""

    @abstractmethod
    def set_pin(self, name: str, version: str | None) -> None:
        """Pin `name` to `version`, durably; None removes the pin (back to the newest that loads)."""

    @abstractmethod
    def hide(self, name: str, items: Mapping[str, HiddenItem]) -> int:
        """Hide these items of model `name` (a hidden one is updated), durably; every worker and host sharing
        the store reads them; -> how many `name` holds hidden now."""

    @abstractmethod
    def unhide(self, name: str, items: Sequence[str]) -> int:
        """Show these items again; -> how many were hidden."""

    @abstractmethod
    def hidden(self, name: str) -> dict[str, HiddenItem]:
        """Model `name`'s hidden items, those whose `until` passed included (readers skip them)."""

    @abstractmethod
    def set_filter(self, name: str, filter_name: str, spec: str | None) -> None:
        """Store model `name`'s named filter (its JSON text), durably; None deletes it."""

    @abstractmethod
    def filters(self, name: str) -> dict[str, str]:
        """Model `name`'s named filters: filter name -> JSON text."""

    @abstractmethod
    def first_cursor(self, since: float) -> str:
        """The cursor before the first arrival the store took at or after `since` (of those it keeps):
        `arrivals` from it reads them, oldest first."""

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
    def add_exposure(self, rows: Mapping[ExposureKey, Exposure]) -> None:
        """Add a worker's exposure to the shared one (and drop buckets past EXPOSURE_KEEP_S)."""

    @abstractmethod
    def exposure(self, name: str, *, since: float) -> dict[tuple[str, str], Exposure]:
        """(version, variant) -> what every worker and host showed of model `name` in the buckets that end
        after `since`, its items the union of theirs."""

    @abstractmethod
    def add_traffic(self, rows: Mapping[TrafficKey, Traffic]) -> None:
        """Add a worker's answers per version and minute to the shared ones (and drop those past ONLINE_KEEP_S)."""

    @abstractmethod
    def traffic(self, name: str, *, since: float) -> dict[TrafficKey, Traffic]:
        """Every worker's and host's answers of model `name`, per version and minute, from `since` on (the
        read covers the span asked for, not the ONLINE_KEEP_S kept)."""

    @abstractmethod
    def add_user_sums(self, sums: Mapping[UserKey, Sequence[float]]) -> None:
        """Add per-user (lists, score sum) of a trial to the shared ones, and move its sides' UserStats."""

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
        The per-user sums of its earlier trials are dropped, but for the last promotion's probation
        (kept under its `ended`, probation_key)."""

    @abstractmethod
    def settle(self, name: str, version: str, *, promote: bool) -> bool:
        """End the running trial of `version` of `name` in one write: its outcome and end time set and, when
        `promote`, the version it replaced (the name's pin until then) recorded and the name pinned to it.
        False (nothing written) when that trial is not running."""

    @abstractmethod
    def roll_back(self, name: str, version: str) -> bool:
        """Undo the promotion of `version` of `name` in one write: its outcome "rolled_back" (never tried
        again) and the name pinned to the version it replaced. False (nothing written) when `version` is
        not the last promoted candidate of `name` on probation."""

    @abstractmethod
    def confirm(self, name: str, version: str) -> bool:
        """End the probation of the promoted `version` of `name` by confirming it, in one write (its `confirmed`
        time set). False (nothing written) when `version` is not the last promoted candidate of `name` on probation."""

    @abstractmethod
    def retrain_record(self, name: str) -> RetrainRecord:
        """The retrainer's record of model `name` (empty before it first wrote one)."""

    @abstractmethod
    def set_retrain_record(self, name: str, record: RetrainRecord) -> None:
        """Keep `record` as the retrainer's record of model `name`, durably."""

    @abstractmethod
    def take_lease(self, name: str, holder: str, *, ttl_s: float, now: float) -> bool:
        """Hold the lease `name` until `now + ttl_s`: True when it was free, past its time, or `holder`'s
        already (renewed); False while another holder's is current. Holders compare their own clocks
        with the time written, so the lease outlasts any skew between hosts by choosing ttl_s."""

    @abstractmethod
    def drop_lease(self, name: str, holder: str) -> None:
        """Give the lease `name` up, when `holder` holds it."""

    @abstractmethod
    def reloads(self) -> int:
        """How many reloads were asked of the deployment: every host reloads when the count grows."""

    @abstractmethod
    def add_reload(self) -> int:
        """One more reload asked (POST /admin/reload, which reaches one host); -> the new count."""

    @abstractmethod
    def expire(self, *, now: float) -> None:
        """Drop what is past its keep time; every housekeeping tick calls it, with or without events."""
