"""The promotion rule and probation: whether a candidate on trial is promoted, retired, or waited on, and
whether a promoted version on probation is confirmed, rolled back, or watched on, from the per-user online
figures of each side over the same time (the production loop applies them: app/production/loop.py). Every
decision is an anytime-valid test (app/production/sequential.py), so reading the figures on every tick for as long
as a decision takes never raises its error rate. Why the user is the unit and what the figures mean:
docs/decisions/online-evaluation.md; the tests: docs/decisions/sequential-tests.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.production.sequential import ALPHA, NONE, Z95, Evidence, one_sided, rate_rise, signs, two_sided
from app.production.traffic import MINUTE_S
from app.settings import ProbationPolicy
from app.store import Candidate, OnlineKey, Sums, Traffic, TrafficKey, UserStats

# Users a side before anything is decided on it: the test is valid with few users, but its variance from
# one to four users' means rested on too little (docs/decisions/sequential-tests.md, the random holdbacks).
MIN_USERS = 5


@dataclass(frozen=True)
class Verdict:
    action: str  # the rule: "promote" | "retire" | "wait"; probation: "confirm" | "roll_back" | "wait"
    reason: str
    figures: dict[str, float | None] = field(default_factory=dict)  # what the reason states, by name


def per_user(side: UserStats) -> tuple[float, float]:
    """(the side's mean of its users' means, each weighted by min(lists, WEIGHT_CAP); the variance of that
    mean, users as the unit: U / (U - 1) * sum(w_u^2 (m_u - m)^2) / W^2, the sum expanded over the running
    sums). A mean over lists (each user weighted by all their lists) collapses its variance when one user
    carries a side, so it finds a version worse than itself far more often than the loop states; each user
    once wastes the lists of the users seen most (docs/decisions/sequential-tests.md)."""
    u = side.users
    if u < 2 or side.w <= 0:
        return (side.wm / side.w if side.w > 0 else 0.0), math.inf
    mean = side.wm / side.w
    spread = max(0.0, side.w2mm - 2 * mean * side.w2m + mean * mean * side.w2)
    return mean, u / (u - 1) * spread / (side.w * side.w)


def compared(a: UserStats, b: UserStats) -> Evidence:
    """Side a's mean NDCG@10 against side b's, users as the unit, as an anytime-valid test; nothing is
    proved while a side has fewer than MIN_USERS users."""
    if min(a.users, b.users) < MIN_USERS:
        return NONE
    (ma, va), (mb, vb) = per_user(a), per_user(b)
    return two_sided(ma, va, a.users, mb, vb, b.users)


def _read(ev: Evidence) -> dict[str, float | None]:
    """An evidence's figures as a verdict shows them."""
    return {
        "difference": ev.difference if ev.df else None,
        "half_width": ev.half_width if math.isfinite(ev.half_width) else None,
        "e_value": ev.e_value,
    }


def judge(candidate: UserStats, live: UserStats, *, min_events: int, margin: float = 0.1) -> Verdict:
    """The promotion rule, on each side's per-user (lists, NDCG@10 sum) since the trial began: retire the
    candidate as soon as its users' mean NDCG@10 is proved below the live version's users'; once both sides
    have `min_events` scored lists from at least MIN_USERS users without that proof, promote it when the lower
    end of the difference's anytime-valid interval clears -margin x the live version's mean (non-inferiority:
    an interval no data bounds yet, or one reaching further down, waits)."""
    ev = compared(candidate, live)
    nc, nl = candidate.n, live.n
    figures: dict[str, float | None] = {
        "candidate_users": candidate.users,
        "live_users": live.users,
        "candidate_lists": nc,
        "live_lists": nl,
        **_read(ev),
    }
    text = (
        f"users' mean NDCG@10 difference {ev.difference:+.4f} (95% half-width {ev.half_width:.4f}), e-value"
        f" {ev.e_value:.3g}"
        f" against {1 / ALPHA:g}, lists {int(nc)} vs {int(nl)}, users {candidate.users} vs {live.users}"
    )
    if ev.worse:
        return Verdict("retire", text, figures)
    if nc < min_events or nl < min_events or min(candidate.users, live.users) < MIN_USERS:
        return Verdict(
            "wait",
            f"{int(nc)} and {int(nl)} scored lists of {candidate.users} and {live.users} users, not proved worse;"
            f" {min_events} lists and {MIN_USERS} users needed on each side to promote",
            figures,
        )
    lower = ev.difference - ev.half_width_anytime
    bound = -margin * (per_user(live)[0] if live.users else 0.0)
    figures |= {"lower": lower if math.isfinite(lower) else None, "margin_bound": bound}
    within = f"; interval's lower end {lower:+.4f} (anytime-valid, at {1 - ALPHA:g}) against {bound:+.4f}"
    if not lower >= bound:
        return Verdict("wait", f"{text}{within}: not shown within the margin ({margin:g} of the live mean)", figures)
    return Verdict("promote", text + within, figures)


def judge_interleaved(side: UserStats, *, min_events: int) -> Verdict:
    """The promotion rule on an interleaved trial, from its per-user credits since it began (s_u > 0: the
    user's events favoured the candidate's items): retire the candidate as soon as the users favouring the
    live version outnumber those favouring it beyond chance (an anytime-valid sign test, users as the
    unit); once `min_events` answers were scored and MIN_USERS users favoured a side without that, promote it."""
    wins, losses = side.positive, side.negative
    ev = signs(wins, losses)
    text = (
        f"users favouring the candidate {wins}, the live version {losses}, neither {side.users - wins - losses};"
        f" sign test e-value {ev.e_value:.3g} against {1 / ALPHA:g}; {int(side.n)} interleaved answers scored"
    )
    figures: dict[str, float | None] = {
        "answers": side.n,
        "favour_candidate": wins,
        "favour_live": losses,
        "favour_neither": side.users - wins - losses,
        "e_value": ev.e_value,
    }
    if ev.worse:
        return Verdict("retire", text, figures)
    if side.n < min_events or wins + losses < MIN_USERS:
        return Verdict("wait", f"{text}; {min_events} answers and {MIN_USERS} users favouring a side needed", figures)
    return Verdict("promote", text, figures)


def verdict(
    candidate: Candidate,
    live_version: str,
    sides: dict[tuple[str, str], UserStats],
    *,
    min_events: int,
    margin: float = 0.1,
) -> Verdict:
    """The rule on a running trial, from its sides' per-user sums (ProductionState.trial_stats)."""
    if candidate.mode == "interleave":
        return judge_interleaved(sides.get((candidate.version, "interleave"), UserStats()), min_events=min_events)
    return judge(
        sides.get((candidate.version, candidate.mode), UserStats()),
        sides.get((live_version, "live"), UserStats()),
        min_events=min_events,
        margin=margin,
    )


@dataclass(frozen=True)
class Window:
    """Scored lists over a span: count, mean NDCG@10 and the variance of one list's NDCG@10."""

    n: float
    mean: float
    var: float

    @classmethod
    def of(cls, sums: Sums) -> Window:
        if sums.n <= 0:
            return cls(0.0, 0.0, 0.0)
        mean = sums.ndcg / sums.n
        return cls(sums.n, mean, max(0.0, sums.ndcg2 / sums.n - mean * mean))


def online_windows(online: Mapping[OnlineKey, Sums], version: str, *, since: float) -> tuple[Window, Window]:
    """`version`'s figures before `since` (every variant it answered in: the trial it was promoted on
    included) and from `since` on as the live version, from the shared per-minute online sums."""
    before, now = Sums(), Sums()
    for (_, v, variant, bucket, _), sums in online.items():
        if v != version or variant == "floor":
            continue
        if bucket < since:
            before.add(sums)
        elif variant == "live":
            now.add(sums)
    return Window.of(before), Window.of(now)


def live_and_floor(online: Mapping[OnlineKey, Sums], version: str, *, since: float) -> tuple[Window, Window]:
    """`version`'s figures as the live version from `since` on, and its floor's on the same lists."""
    live, floor = Sums(), Sums()
    for (_, v, variant, bucket, _), sums in online.items():
        if v == version and bucket + 60.0 > since:
            if variant == "live":
                live.add(sums)
            elif variant == "floor":
                floor.add(sums)
    return Window.of(live), Window.of(floor)


def sagged(before: Window, now: Window) -> tuple[float, float]:
    """(how much lower `now`'s mean NDCG@10 is than `before`'s, the 95% interval's half-width of that
    difference), lists as the unit: the shared per-minute sums hold each list's NDCG@10 and its square,
    not per-user sums outside a trial, so the interval is narrower than the rule's per-user one."""
    return before.mean - now.mean, Z95 * math.sqrt(before.var / before.n + now.var / now.n)


@dataclass(frozen=True)
class Sides:
    """What probation reads of a promotion since it landed: the new version's lists per user and the per-user
    differences of those lists from their reference lists (its floor), both None where no NDCG@10 is read
    (events posted without a key, or a model whose answers are not scored); its holdback's lists (the
    version it replaced, answering a share of the users over the same time; None without one, or where no
    NDCG@10 is read); and each side's answers (the service's own measurements, which a client cannot post)."""

    live: UserStats | None
    floor: UserStats | None
    holdback: UserStats | None
    served_live: Traffic
    served_holdback: Traffic | None


def probation_sides(
    cand: Candidate,
    stats: Mapping[tuple[str, str], UserStats],
    traffic: Mapping[TrafficKey, Traffic],
    *,
    scored: bool,
    held: bool,
) -> Sides:
    """Probation's sides of the promotion `cand` from the store's per-user sums under its promotion time and
    the answers since. `scored`: its lists are scored by events that needed a key (without one, anyone could
    post the figures: none is read); `held`: a holdback serves."""
    assert cand.ended is not None and cand.replaced is not None
    served_live, served_old = Traffic(), Traffic()
    for (_, version, bucket), t in traffic.items():
        if bucket + MINUTE_S > cand.ended:
            if version == cand.version:
                served_live.add(t)
            elif version == cand.replaced:
                served_old.add(t)
    none = UserStats()
    return Sides(
        live=stats.get((cand.version, "live"), none) if scored else None,
        floor=stats.get((cand.version, "floor"), none) if scored else None,
        holdback=stats.get((cand.replaced, "holdback"), none) if scored and held else None,
        served_live=served_live,
        served_holdback=served_old if held else None,
    )


def probation(cand: Candidate, sides: Sides, *, now: float, settings: ProbationPolicy) -> Verdict:
    """Probation's decision on the promotion `cand` (SEQSERVE_PROBATION_*): rolled back as soon as one of its
    figures is proved worse (its NDCG@10 against its holdback's, users as the unit; its NDCG@10 against its
    own reference lists'; its answers' 5xx share against the holdback's) or its p99 latency is past its bound
    against the holdback's; confirmed once PROBATION_S has passed with each figure's evidence in (each side's
    PROBATION_MIN_LISTS lists from PROBATION_MIN_USERS users) and nothing found; rolled back when
    PROBATION_MAX_S passes first. Never left undecided."""
    s = settings
    assert cand.ended is not None
    found: list[str] = []
    figures: dict[str, float | None] = {"seconds": now - cand.ended}
    if sides.live is not None:
        figures |= {"live_users": sides.live.users, "live_lists": sides.live.n}
    checks: list[tuple[str, UserStats, Evidence, str]] = []  # (its figures' prefix, its side, the test, against)
    if sides.live is not None and sides.holdback is not None:
        live, held = sides.live, sides.holdback
        against = (
            f"its holdback ({cand.replaced}) over the same time (users as the unit: {live.users} and {held.users},"
            f" lists {int(live.n)} and {int(held.n)})"
        )
        checks.append(("holdback", held, compared(live, held), against))
    if sides.floor is not None:
        floor = sides.floor
        mean, var = per_user(floor)
        below = one_sided(mean, var, floor.users) if floor.users >= MIN_USERS else NONE
        against = (
            f"its own reference lists (its popularity, the same exclusions) on the same {int(floor.n)} lists of"
            f" {floor.users} users"
        )
        checks.append(("floor", floor, below, against))
    read = []  # what each test read, for the log line of a confirmation
    for prefix, side, ev, against in checks:
        figures |= {f"{prefix}_users": side.users, f"{prefix}_lists": side.n}
        figures |= {f"{prefix}_{k}": v for k, v in _read(ev).items()}
        read.append(f"against {prefix} {ev.difference:+.4f}, e-value {ev.e_value:.3g} ({side.users} users)")
        if ev.worse:
            found.append(
                f"users' mean online NDCG@10 {ev.difference:+.4f} against {against}, e-value {ev.e_value:.3g}"
                f" against {1 / ALPHA:g}"
            )
    found += _answers(sides, settings)
    if found:
        return Verdict("roll_back", "; ".join(found), figures)
    missing = _evidence_missing(sides, settings)
    age = now - cand.ended
    if age >= s.probation_max_s:
        why = "; ".join(missing) if missing else "nothing found"
        return Verdict("roll_back", f"undecided after {age:.0f} s (SEQSERVE_PROBATION_MAX_S): {why}", figures)
    if age >= s.probation_s and not missing:
        why = f"nothing worse after {age:.0f} s with each figure's evidence in"
        return Verdict("confirm", "; ".join([why, *read]), figures)
    wait = missing or [f"{s.probation_s - age:.0f} s of SEQSERVE_PROBATION_S left"]
    return Verdict("wait", "; ".join(wait), figures)


def _evidence_missing(sides: Sides, s: ProbationPolicy) -> list[str]:
    """What each NDCG@10 figure read still lacks before probation may confirm a version (empty: all there)."""
    out = []
    named = [("its lists", sides.live), ("its reference lists", sides.floor), ("the holdback's lists", sides.holdback)]
    for what, side in named:
        if side is not None and (side.n < s.probation_min_lists or side.users < s.probation_min_users):
            out.append(
                f"{what}: {int(side.n)} of {side.users} users, {s.probation_min_lists} lists of"
                f" {s.probation_min_users} users needed"
            )
    return out


def _answers(sides: Sides, s: ProbationPolicy) -> list[str]:
    """The new version's answers against its holdback's over the same time: a 5xx share proved higher (counts,
    `rate_rise`) and higher by more than its bound, read from the first answer on (a version failing every
    request is found on a few dozen), [] without a holdback (a share alone cannot tell a version from its
    load); a p99 past its ratio, once each side has probation_min_requests answers."""
    new, old = sides.served_live, sides.served_holdback
    found: list[str] = []
    if old is None or min(old.n, new.n) <= 0:
        return found
    p0, p1 = old.errors / old.n, new.errors / new.n
    ev = rate_rise(int(new.errors), int(new.n), int(old.errors), int(old.n))
    if p1 - p0 > s.probation_max_5xx_rise and ev.difference > 0 and ev.e_value >= 1 / ALPHA:
        found.append(
            f"5xx share {p1:.4f} of {int(new.n)} answers against {p0:.4f} of {int(old.n)} of its holdback, above"
            f" the {s.probation_max_5xx_rise} rise allowed (e-value {ev.e_value:.3g})"
        )
    if min(old.n, new.n) < s.probation_min_requests:
        return found
    q_old, q_new = old.quantile(0.99), new.quantile(0.99)
    if q_old is not None and q_new is not None and q_new > q_old * s.probation_max_p99_ratio:
        found.append(
            f"p99 latency {q_new * 1000:.1f} ms over {int(new.n)} answers against {q_old * 1000:.1f} ms of its"
            f" holdback over the same time, above {s.probation_max_p99_ratio}x (histogram steps of 25%)"
        )
    return found
