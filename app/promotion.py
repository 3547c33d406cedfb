"""The promotion rule: whether a candidate on trial is promoted, retired, or waited on, from each side's
per-user online figures since the trial began (the production loop applies it: app/production.py).
Why the user is the unit and what the interval means: docs/decisions/online-evaluation.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.online import Z95
from app.store import UserStats

MIN_USERS = 30  # the rule decides only with this many users on each side (its unit)


@dataclass(frozen=True)
class Verdict:
    action: str  # "promote" | "retire" | "wait"
    reason: str


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
    if nc < min_events or nl < min_events or min(candidate.users, live.users) < MIN_USERS:
        return Verdict(
            "wait",
            f"{int(nc)} and {int(nl)} scored lists of {candidate.users} and {live.users} users;"
            f" {min_events} lists and {MIN_USERS} users needed on each side",
        )
    diff, half = mc - ml, Z95 * math.sqrt(vc + vl)
    text = (
        f"NDCG@10 difference {diff:+.4f}, interval half-width {half:.4f} (users as the unit), "
        f"lists {int(nc)} vs {int(nl)}, users {candidate.users} vs {live.users}"
    )
    return Verdict("promote" if diff >= -half else "retire", text)
