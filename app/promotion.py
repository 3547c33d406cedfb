"""The promotion rule: whether a candidate on trial is promoted, retired, or waited on, from each side's
per-user online figures since the trial began, or an interleaved trial's per-user credits (the production
loop applies it: app/production.py). Why the user is the unit and what the interval means:
docs/decisions/online-evaluation.md; the sign test: docs/decisions/interleaving.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.online import Z95
from app.settings import Settings
from app.store import Candidate, OnlineKey, Sums, Traffic, TrafficKey, UserStats

MIN_USERS = 30  # the rule decides only with this many users on each side (its unit)
ALPHA = 0.05  # two-sided: the 95% of the canary's interval, for the interleaved sign test
SIGN_EXACT = 1000  # users up to which the sign test sums the binomial tail exactly


@dataclass(frozen=True)
class Verdict:
    action: str  # "promote" | "retire" | "wait"
    reason: str
    figures: dict[str, float | None] = field(default_factory=dict)  # what the reason states, by name


def clustered(side: UserStats) -> tuple[float, float, float]:
    """(lists, mean NDCG@10, variance of that mean) with the user as the unit: a user's lists are not
    independent (a burst of ratings is many lists of one user), so the variance is the ratio
    estimator's over users, (U / (U - 1)) * sum((S_u - m N_u)^2) / N^2, the sum expanded over the
    running sums (UserStats) as sum(S^2) - 2 m sum(N S) + m^2 sum(N^2)."""
    n = side.n
    if n <= 0:
        return 0.0, 0.0, math.inf
    mean = side.s / n
    if side.users < 2:
        return n, mean, math.inf
    spread = max(0.0, side.ss - 2 * mean * side.ns + mean * mean * side.nn)
    return n, mean, side.users / (side.users - 1) * spread / (n * n)


def judge(candidate: UserStats, live: UserStats, *, min_events: int) -> Verdict:
    """The promotion rule, on each side's per-user (lists, NDCG@10 sum) since the trial began:
    once both have `min_events` scored lists from at least MIN_USERS users, promote the candidate
    unless its NDCG@10 is below the live version's by more than the 95% interval of the difference
    (users as the unit); retire it when it is."""
    (nc, mc, vc), (nl, ml, vl) = clustered(candidate), clustered(live)
    diff, half = mc - ml, Z95 * math.sqrt(vc + vl)
    figures: dict[str, float | None] = {
        "candidate_users": candidate.users,
        "live_users": live.users,
        "candidate_lists": nc,
        "live_lists": nl,
        "difference": diff if nc and nl else None,
        "half_width": half if math.isfinite(half) else None,
    }
    if nc < min_events or nl < min_events or min(candidate.users, live.users) < MIN_USERS:
        return Verdict(
            "wait",
            f"{int(nc)} and {int(nl)} scored lists of {candidate.users} and {live.users} users;"
            f" {min_events} lists and {MIN_USERS} users needed on each side",
            figures,
        )
    text = (
        f"NDCG@10 difference {diff:+.4f}, interval half-width {half:.4f} (users as the unit), "
        f"lists {int(nc)} vs {int(nl)}, users {candidate.users} vs {live.users}"
    )
    return Verdict("promote" if diff >= -half else "retire", text, figures)


def sign_test(positive: int, negative: int) -> float:
    """Two-sided p-value of `positive` against `negative` (ties left out) when either is as likely: the
    binomial tail, exact up to SIGN_EXACT users and the normal approximation with continuity beyond."""
    n, low = positive + negative, min(positive, negative)
    if n == 0:
        return 1.0
    if n <= SIGN_EXACT:
        return min(1.0, 2 * sum(math.comb(n, i) for i in range(low + 1)) / 2**n)
    z = (n / 2 - low - 0.5) / math.sqrt(n / 4)
    return min(1.0, math.erfc(z / math.sqrt(2)))


def judge_interleaved(side: UserStats, *, min_events: int) -> Verdict:
    """The promotion rule on an interleaved trial, from its per-user credits since it began (s_u > 0: the
    user's events favoured the candidate's items): once `min_events` answers were scored and MIN_USERS
    users favoured a side, promote the candidate unless a sign test (users as the unit) finds the live
    version favoured at 95%; retire it when it does."""
    wins, losses = side.positive, side.negative
    p = sign_test(wins, losses)
    text = (
        f"users favouring the candidate {wins}, the live version {losses}, neither {side.users - wins - losses};"
        f" sign test p {p:.4f}; {int(side.n)} interleaved answers scored"
    )
    figures: dict[str, float | None] = {
        "answers": side.n,
        "favour_candidate": wins,
        "favour_live": losses,
        "favour_neither": side.users - wins - losses,
        "p_value": p,
    }
    if side.n < min_events or wins + losses < MIN_USERS:
        return Verdict("wait", f"{text}; {min_events} answers and {MIN_USERS} users favouring a side needed", figures)
    return Verdict("retire" if losses > wins and p < ALPHA else "promote", text, figures)


def verdict(
    candidate: Candidate, live_version: str, sides: dict[tuple[str, str], UserStats], *, min_events: int
) -> Verdict:
    """The rule on a running trial, from its sides' per-user sums (ProductionState.trial_stats)."""
    if candidate.mode == "interleave":
        return judge_interleaved(sides.get((candidate.version, "interleave"), UserStats()), min_events=min_events)
    return judge(
        sides.get((candidate.version, candidate.mode), UserStats()),
        sides.get((live_version, "live"), UserStats()),
        min_events=min_events,
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
    """`version`'s figures before `since` (every variant: the trial it was promoted on included) and from
    `since` on as the live version, from the shared per-minute online sums."""
    before, now = Sums(), Sums()
    for (_, v, variant, bucket, _), sums in online.items():
        if v != version:
            continue
        if bucket < since:
            before.add(sums)
        elif variant == "live":
            now.add(sums)
    return Window.of(before), Window.of(now)


def sagged(before: Window, now: Window) -> tuple[float, float]:
    """(how much lower `now`'s mean NDCG@10 is than `before`'s, the 95% interval's half-width of that
    difference), lists as the unit: the shared per-minute sums hold each list's NDCG@10 and its square,
    not per-user sums outside a trial, so the interval is narrower than the rule's per-user one."""
    return before.mean - now.mean, Z95 * math.sqrt(before.var / before.n + now.var / now.n)


def probation_findings(
    cand: Candidate,
    online: Mapping[OnlineKey, Sums],
    traffic: Mapping[TrafficKey, Traffic],
    *,
    users: UserStats,
    holdback: UserStats | None,
    settings: Settings,
) -> list[str]:
    """What is worse beyond its bound about `cand`, a promoted version, as the live version since its
    promotion against the version it replaced: each finding with its figures; [] while nothing is, or
    while a side lacks the figures to say. `users`: the new version's lists since the promotion summed per
    user (one user's lists move together: the user is the unit). The old side's NDCG@10: `holdback`, the
    same sums of the users it kept answering over the same time; with no holdback (None), its shared
    per-minute sums in `online` over as long before the promotion, lists as the unit, which also moves
    with whoever came back first and with the period (docs/decisions/online-evaluation.md). The answers'
    5xx share and p99 latency: `traffic` after the promotion against as long before it."""
    s, ended, old_version = settings, cand.ended, cand.replaced
    assert ended is not None and old_version is not None
    found = []
    n, mean, var = clustered(users)
    if holdback is not None:
        old_n, old_mean, old_var = clustered(holdback)
        enough_users = min(users.users, holdback.users) >= s.probation_min_users
        old_side = f"{int(old_n)} lists of {int(holdback.users)} users kept on {old_version} (the holdback)"
    else:
        old = Sums()
        for (_, version, variant, bucket, _), sums in online.items():
            if version == old_version and variant == "live" and ended - s.probation_s <= bucket < ended:
                old.add(sums)
        before = Window.of(old)
        old_n, old_mean = before.n, before.mean
        old_var = before.var / before.n if before.n else math.inf
        enough_users = users.users >= s.probation_min_users
        old_side = f"{int(old_n)} lists of {old_version} before it"
    if min(old_n, n) >= s.probation_min_lists and enough_users:
        drop, half = old_mean - mean, Z95 * math.sqrt(old_var + var)
        if drop > half:
            found.append(
                f"online NDCG@10 {mean:.4f} over {int(n)} lists of {int(users.users)} users since promotion against"
                f" {old_mean:.4f} over {old_side}, {drop:.4f} lower, interval half-width {half:.4f}"
                " (users as the unit)"
            )
    served_old, served_new = Traffic(), Traffic()
    for (_, version, bucket), t in traffic.items():
        if version == cand.version and bucket >= ended:
            served_new.add(t)
        elif version == old_version and ended - s.probation_s <= bucket < ended:
            served_old.add(t)
    if min(served_old.n, served_new.n) < s.probation_min_requests:
        return found
    p0, p1 = served_old.errors / served_old.n, served_new.errors / served_new.n
    pooled = (served_old.errors + served_new.errors) / (served_old.n + served_new.n)
    se = math.sqrt(pooled * (1 - pooled) * (1 / served_old.n + 1 / served_new.n))
    if p1 - p0 > s.probation_max_5xx_rise and (se == 0 or (p1 - p0) / se > Z95):
        found.append(
            f"5xx share {p1:.4f} of {int(served_new.n)} answers since promotion against {p0:.4f} of"
            f" {int(served_old.n)} before it, above the {s.probation_max_5xx_rise} rise allowed"
        )
    q_old, q_new = served_old.quantile(0.99), served_new.quantile(0.99)
    if q_old is not None and q_new is not None and q_new > q_old * s.probation_max_p99_ratio:
        found.append(
            f"p99 latency {q_new * 1000:.1f} ms over {int(served_new.n)} answers since promotion against"
            f" {q_old * 1000:.1f} ms before it, above {s.probation_max_p99_ratio}x (histogram steps of 25%)"
        )
    return found
