"""Online evaluation, framework-free: each list served to a user is scored against that user's next event.

A worker keeps the lists it served by user (`ServedLists`): per (namespace, user) the newest few,
each with its model, version, variant ("live", "canary", "shadow") and the time it was served;
bounded per user and in total, dropped after the window. Events reach every worker through the
store's arrivals (own events in the order they were stored, whichever worker or host took them);
an arrival scores, per model and variant, the newest list served to its user before it and within
the window, and the older lists of that model and variant are dropped unscored ("superseded"): a
user who reloads a page ten times before acting is one scored list, not ten. Scores: hit@10,
NDCG@10 and reciprocal rank of the event's item in the top 10 (MRR@10; 0 when absent): a worker holds
each list's top 10 only, whatever k was asked. The sums go to the
store per time bucket, where every worker and host adds its own (docs/decisions/online-evaluation.md).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from app.production.interleave import credit
from app.production.sequential import Z95
from app.store import Arrival, Exposure, OnlineKey, Sums, UserKey
from app.store.state import segment_groups

CUT = 10  # the online figures' K: HR@10, NDCG@10
BUCKET_S = 60.0  # online sums are kept per minute (the console's time axis)
LISTS_PER_USER = 16  # lists kept per (namespace, user), all models and variants together
AT = 4  # ServedList.at's place in a kept tuple


class ServedList(NamedTuple):
    model: str
    version: str
    variant: str
    items: tuple[str, ...]
    at: float  # the server's clock when it was served
    trial_start: float | None = None  # when the running trial began, as it was served (its figures count per user)
    teams: str = ""  # an interleaved list's: each position's team (app/production/interleave.py)
    recommendation_id: str = ""  # an event naming it scores this list (attribution)
    floor: tuple[str, ...] = ()  # a live list's reference list (its version's popularity, the same exclusions)
    fallback: bool = False  # a list answering a user the version does not know (not the model's): its own segment


def score(items: Sequence[str], target: str) -> Sums:
    """One list against the item the user took next."""
    try:
        rank = items.index(target) + 1
    except ValueError:
        return Sums(n=1)
    ndcg = 1.0 / math.log2(rank + 1) if rank <= CUT else 0.0
    return Sums(n=1, hits=float(rank <= CUT), ndcg=ndcg, ndcg2=ndcg * ndcg, rr=1.0 / rank)


# (a scored list, its user) -> the list's segment (segment_of), or "" when it cannot be told any more
Segmenter = Callable[[ServedList, str], str]


@dataclass
class Tally:
    """What one worker counted since its sums last went to the store."""

    sums: dict[OnlineKey, Sums] = field(default_factory=dict)
    # (model, trial start, version, variant, user) -> [lists, NDCG@10 sum] (interleaved: [lists, credits]):
    # the rule's unit is the user
    users: dict[UserKey, list[float]] = field(default_factory=dict)
    credits: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, side credited) -> interleaved answers
    # The lists shown to users (not a shadow's) since the last take, as kept: counted off the answer path.
    shown: list[tuple[Any, ...]] = field(default_factory=list)
    superseded: int = 0
    expired: int = 0
    evicted: int = 0


class ServedLists:
    """What one worker served by user. A user's lists are one plain tuple of plain tuples (ids, times):
    tuples of strings and numbers leave the garbage collector's tracking, so holding a few hundred
    thousand lists adds nothing to its full collections (as dataclass objects and per-user lists they
    cost 15-24 us of the event loop per request, docs/decisions/online-evaluation.md)."""

    def __init__(self, *, window_s: float, max_lists: int) -> None:
        self.window_s, self.max_lists = window_s, max_lists
        self._lists: OrderedDict[tuple[str, str], tuple[tuple[Any, ...], ...]] = OrderedDict()  # oldest touched first
        self.size = 0
        self.tally = Tally()
        # Every arrival stored before this time has been scored (set by the scoring loop, with a margin).
        self.settled_before = 0.0

    def record(self, namespace: str, user: str, served: tuple[Any, ...]) -> None:
        """Keep `served` (a ServedList's fields, as a plain tuple or a ServedList)."""
        key = (namespace, user)
        entry = served if type(served) is tuple else tuple(served)
        kept = self._lists.get(key)
        if kept is None:
            self._lists[key] = (entry,)
        else:
            self._lists.move_to_end(key)
            if kept[0][AT] < self.settled_before:
                kept = self._drop_settled(kept, entry)
            if len(kept) >= LISTS_PER_USER:
                kept = kept[1:]
                self.size -= 1
                self.tally.evicted += 1
            self._lists[key] = (*kept, entry)
        self.size += 1
        if entry[2] != "shadow" and len(self.tally.shown) < self.max_lists:
            self.tally.shown.append(entry)
        while self.size > self.max_lists:
            _, oldest = self._lists.popitem(last=False)
            self.size -= len(oldest)
            self.tally.evicted += len(oldest)

    def _drop_settled(self, kept: tuple[tuple[Any, ...], ...], entry: tuple[Any, ...]) -> tuple[tuple[Any, ...], ...]:
        """Of the lists of `entry`'s model and variant served before `settled_before` (every arrival up to
        then has been scored), only the newest can still be the one an arrival scores: the older are
        superseded now rather than held until the user's next event (or forever, if none comes)."""
        same = [n for n, s in enumerate(kept) if s[0] == entry[0] and s[2] == entry[2] and s[AT] < self.settled_before]
        if len(same) < 2:
            return kept
        drop = set(same[:-1])
        self.size -= len(drop)
        self.tally.superseded += len(drop)
        return tuple(s for n, s in enumerate(kept) if n not in drop)

    def score(
        self, arrivals: Iterable[Arrival], *, segment: Segmenter | None = None
    ) -> list[tuple[ServedList, Sums, str]]:
        """Score the lists each arrival follows; -> each scored list with its scores and its segment
        (`segment`'s, for the list and the arrival's user; "" without one)."""
        out = []
        for a in arrivals:
            kept = self._lists.get((a.namespace, a.user))
            if not kept:
                continue
            before = [ServedList(*s) for s in kept if a.at - self.window_s <= s[AT] <= a.at]
            newest: dict[tuple[str, str], ServedList] = {}
            for s in before:  # oldest first: the last one of each model and variant wins
                newest[(s.model, s.variant)] = s
            named = None
            if a.recommendation_id:  # the list the event names, in place of its model and variant's newest
                named = next((s for s in before if s.recommendation_id == a.recommendation_id), None)
                if named is not None:
                    newest[(named.model, named.variant)] = named
            for s in newest.values():
                scored = score(s.items, a.item)
                scored.attributed = float(s is named)
                seg = segment(s, a.user) if segment is not None else ""
                bucket = math.floor(a.at / BUCKET_S) * BUCKET_S
                self.tally.sums.setdefault((s.model, s.version, s.variant, bucket, seg), Sums()).add(scored)
                floor = score(s.floor, a.item) if s.floor and s.variant == "live" else None
                if floor is not None:  # the same event against the list's reference list: its floor
                    self.tally.sums.setdefault((s.model, s.version, "floor", bucket, seg), Sums()).add(floor)
                if s.trial_start is not None:
                    self._per_user(s, a, scored, floor)
                out.append((s, scored, seg))
            self.tally.superseded += len(before) - len(newest)
            left = tuple(s for s in kept if not (s[AT] <= a.at and (s[0], s[2]) in newest))
            self.size -= len(kept) - len(left)
            if left:
                self._lists[(a.namespace, a.user)] = left
            else:
                del self._lists[(a.namespace, a.user)]
        return out

    def _per_user(self, s: ServedList, a: Arrival, scored: Sums, floor: Sums | None) -> None:
        """A scored list of a trial (or a promotion on probation) added to its user's sums, the rule's unit:
        its NDCG@10, an interleaved list's credit, and a live list's NDCG@10 less its reference list's."""
        assert s.trial_start is not None
        ukey = (s.model, s.trial_start, s.version, s.variant, a.user)
        per_user = self.tally.users.setdefault(ukey, [0.0, 0.0])
        per_user[0] += 1
        if s.variant == "interleave":
            got = credit(s.items, s.teams, a.item)
            per_user[1] += got
            side = "candidate" if got > 0 else "live" if got < 0 else "neither"
            self.tally.credits[(s.model, side)] = self.tally.credits.get((s.model, side), 0) + 1
        else:
            per_user[1] += scored.ndcg
        if floor is not None:
            gap = self.tally.users.setdefault((s.model, s.trial_start, s.version, "floor", a.user), [0.0, 0.0])
            gap[0] += 1
            gap[1] += scored.ndcg - floor.ndcg

    def expire(self, now: float | None = None) -> None:
        """Drop the lists older than the window (the users touched longest ago are at the front)."""
        limit = (now if now is not None else time.time()) - self.window_s
        while self._lists:
            key, kept = next(iter(self._lists.items()))
            if kept[-1][AT] >= limit:
                break
            del self._lists[key]
            self.size -= len(kept)
            self.tally.expired += len(kept)

    def take(self) -> Tally:
        """The counts since the last take (they go to the store and the metrics)."""
        out, self.tally = self.tally, Tally()
        return out


@dataclass(frozen=True)
class Figures:
    """A model version's online figures with their 95% intervals."""

    n: int
    hr10: float
    hr10_ci: tuple[float, float]
    ndcg10: float
    ndcg10_ci: tuple[float, float]
    mrr: float
    attributed: int  # of the n, those scored by an event naming their recommendation_id

    def as_json(self) -> dict[str, object]:
        return {
            "n": self.n,
            "hr10": round(self.hr10, 5),
            "hr10_ci": [round(x, 5) for x in self.hr10_ci],
            "ndcg10": round(self.ndcg10, 5),
            "ndcg10_ci": [round(x, 5) for x in self.ndcg10_ci],
            "mrr": round(self.mrr, 5),
            "attributed": self.attributed,
        }


def ndcg_half_width(s: Sums) -> float:
    """Half the 95% normal interval of the mean NDCG@10 (0 for fewer than two lists)."""
    if s.n < 2:
        return 0.0
    mean = s.ndcg / s.n
    var = max(0.0, (s.ndcg2 - s.n * mean * mean) / (s.n - 1))
    return Z95 * math.sqrt(var / s.n)


def figures(s: Sums) -> Figures | None:
    if s.n < 1:
        return None
    n, p = s.n, s.hits / s.n
    # Wilson's interval for a share: sensible at 0 and 1 hits, where the normal one collapses.
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    mean, h = s.ndcg / n, ndcg_half_width(s)
    return Figures(
        n=int(n),
        hr10=p,
        hr10_ci=(max(0.0, centre - half), min(1.0, centre + half)),
        ndcg10=mean,
        ndcg10_ci=(max(0.0, mean - h), min(1.0, mean + h)),
        mrr=s.rr / n,
        attributed=int(s.attributed),
    )


def totals(rows: Mapping[OnlineKey, Sums], *, since: float = 0.0) -> dict[tuple[str, str], Sums]:
    """(version, variant) -> the sums of its buckets from `since` on, every segment."""
    out: dict[tuple[str, str], Sums] = {}
    for (_, version, variant, bucket, _), s in rows.items():
        if bucket + BUCKET_S > since:
            out.setdefault((version, variant), Sums()).add(s)
    return out


def by_segment(rows: Mapping[OnlineKey, Sums], *, since: float = 0.0) -> dict[tuple[str, str], dict[str, Sums]]:
    """(version, variant) -> group (segment_groups) -> the sums of its buckets from `since` on."""
    out: dict[tuple[str, str], dict[str, Sums]] = {}
    for (_, version, variant, bucket, segment), s in rows.items():
        groups = segment_groups(segment)
        if groups is not None and bucket + BUCKET_S > since:
            mine = out.setdefault((version, variant), {})
            for group in groups:
                mine.setdefault(group, Sums()).add(s)
    return out


def exposure_of(
    shown: Iterable[tuple[Any, ...]], heads: Mapping[tuple[str, str], frozenset[str]]
) -> dict[tuple[str, str, str], Exposure]:
    """(model, version, variant) -> what the lists `shown` (ServedList fields) showed, their slots in the
    popular head of their version (`heads`; none counted for a version not there)."""
    out: dict[tuple[str, str, str], Exposure] = {}
    for s in shown:
        key = (s[0], s[1], s[2])
        e = out.get(key)
        if e is None:
            e = out[key] = Exposure()
        items, head = s[3], heads.get((s[0], s[1]), frozenset())
        e.lists += 1
        e.slots += len(items)
        e.head += len(head.intersection(items))  # a list's items are distinct
        e.items.update(items)
    return out


@dataclass(frozen=True)
class ExposureFigures:
    """What a version showed over a span, as shares: of the catalog its lists covered, of their item
    slots held by the popular head (models.engine.HEAD_SHARE)."""

    lists: int
    items: int  # distinct items shown
    coverage: float
    head_share: float

    @classmethod
    def of(cls, e: Exposure, catalog_size: int) -> ExposureFigures:
        return cls(
            lists=int(e.lists),
            items=len(e.items),
            coverage=len(e.items) / catalog_size if catalog_size else 0.0,
            head_share=e.head / e.slots if e.slots else 0.0,
        )

    def as_json(self) -> dict[str, object]:
        return {
            "lists": self.lists,
            "items": self.items,
            "coverage": round(self.coverage, 5),
            "head_share": round(self.head_share, 5),
        }
