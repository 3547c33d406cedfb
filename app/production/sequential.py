"""Anytime-valid tests for the loop's decisions: a trial's rule, probation and the floor look at the
figures on every housekeeping tick, for as long as it takes, so each test must stay valid however often
it is read and however few users it has (docs/decisions/sequential-tests.md).

Each test is an e-value: a statistic whose expectation is at most 1 when nothing differs, so the chance
that it ever reaches 1 / ALPHA, at any of any number of looks, is at most ALPHA (Ville's inequality) for
independent normal observations. The loop's per-user means are neither, so ALPHA was set by measuring.
- Two sides (a candidate against the live version, a promoted version against its holdback): the
  two-sample t-test's mixture over the standardised difference (Gönen et al. 2005; anytime-valid with
  the scale's right-Haar prior, Pérez-Ortiz et al. 2024), read on each side's mean of its users' means
  (weighted by their lists, capped) and its variance (app.promotion.per_user), with Welch's degrees
  of freedom.
- One side against zero (the floor: per user, a list's NDCG@10 less its reference list's): the
  one-sample form.
- Signs (an interleaved trial's users favouring either side): the binomial mixture with Jeffreys'
  prior against an even chance.
- Rates (a version's 5xx share against its holdback's, or against a bound): counts, not means of 0/1
  figures, so a side with no spread (every request failed, or none) is still evidence: the binomial
  likelihood ratio averaged over alternatives above the null's rate (`rate_above`).
A side without spread (every user's mean alike, or a variance that underflows) is no reason to know
nothing: the difference is then exact, and the t-mixture takes its limit as t grows, its cap
(1 + n G)^(df / 2). Each mixture also gives its confidence sequence (`half_width_anytime`): the
differences it would not reject at ALPHA, valid however often it is read.
Pure functions of running sums: no store, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Each test's level: an e-value of 1 / ALPHA is proof. Per-user means are neither normal nor fixed once seen
# (they move as a user's lists come), so the guarantee is not exact here: the rate at which a version equal
# to the one it replaced is found worse was measured on replays' own lists, and this level keeps it under
# the rate the loop states (docs/decisions/sequential-tests.md).
ALPHA = 0.01
Z95 = 1.959964
# The mixture's variance of the standardised difference: effects of about two users' spreads. An e-value over
# few users is capped at (1 + n G)^(df / 2) however far apart the sides are, and a smaller G put proof out of
# reach of a holdback of a few heavy users (docs/decisions/sequential-tests.md).
G = 4.0


@dataclass(frozen=True)
class Evidence:
    """One read of a test: the difference it estimates, its e-value, and whether that is proof at ALPHA."""

    difference: float  # the mean's (or the means' difference's) estimate; negative: the tested side is lower
    half_width: float  # the fixed-sample 95% half-width, for reading only (the decision is the e-value's)
    e_value: float
    df: float  # degrees of freedom of the variance
    # The confidence sequence's half-width at ALPHA (inf: too little to bound the difference): valid at
    # every read, so a rule may act on its ends as it acts on the e-value.
    half_width_anytime: float = math.inf

    @property
    def worse(self) -> bool:
        """Proof that the tested side is lower, at ALPHA, whenever it is read."""
        return self.difference < 0 and self.e_value >= 1 / ALPHA


def _log_t_mixture(t: float, df: float, n_eff: float) -> float:
    """log of the mixture e-value of a t statistic with `df` degrees of freedom over `n_eff` effective units;
    t may be infinite (a difference without spread): the limit, (df / 2) log(1 + r)."""
    r = n_eff * G
    a = t * t / df
    # Past 1e250 the two logs' difference has reached its limit (an infinite t included).
    gap = math.log1p(a) - math.log1p(a / (1 + r)) if a < 1e250 else math.log1p(r)
    return -0.5 * math.log1p(r) + (df + 1) / 2 * gap


def _t_mixture(t: float, df: float, n_eff: float) -> float:
    return math.exp(min(_log_t_mixture(t, df, n_eff), 700.0))


def _t_bound(df: float, n_eff: float) -> float:
    """The |t| at which the mixture reaches 1 / ALPHA (inf where even an exact difference cannot): the
    confidence sequence's half-width in standard errors."""
    target = math.log(1 / ALPHA)
    if _log_t_mixture(math.inf, df, n_eff) <= target:
        return math.inf
    lo, hi = 0.0, 1.0
    while _log_t_mixture(hi, df, n_eff) < target:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _log_t_mixture(mid, df, n_eff) < target else (lo, mid)
    return hi


NONE = Evidence(0.0, math.inf, 1.0, 0.0)  # a read with too little to say anything


def _t_evidence(diff: float, var: float, df: float, n_eff: float) -> Evidence:
    """A difference with the variance of its estimate: var 0 (or too small to divide by) and a difference
    is exact; var 0 and none is no evidence of one."""
    sd = math.sqrt(var) if var > 0 else 0.0
    exact = 0.0 if diff == 0 else math.copysign(math.inf, diff)
    t = diff / sd if sd > 0 and math.isfinite(diff / sd) else exact
    bound = _t_bound(df, n_eff)
    anytime = bound * sd if math.isfinite(bound) else math.inf
    return Evidence(diff, Z95 * sd, _t_mixture(t, df, n_eff), df, anytime)


def two_sided(mean_a: float, var_a: float, users_a: int, mean_b: float, var_b: float, users_b: int) -> Evidence:
    """Side a against side b: each a mean with the variance of that mean and its users (the unit);
    difference = mean_a - mean_b. NONE while a side has fewer than two users or an unknown variance."""
    if min(users_a, users_b) < 2 or not (math.isfinite(var_a) and math.isfinite(var_b)):
        return NONE
    var_a, var_b = max(var_a, 0.0), max(var_b, 0.0)
    scale = max(var_a, var_b)
    if scale > 0:  # Welch's degrees of freedom on the variances scaled to 1: no underflow to 0 / 0
        sa, sb = var_a / scale, var_b / scale
        welch = (sa + sb) ** 2 / (sa * sa / (users_a - 1) + sb * sb / (users_b - 1))
    else:  # no spread on either side: the pooled count
        welch = float(users_a + users_b - 2)
    n_eff = users_a * users_b / (users_a + users_b)
    return _t_evidence(mean_a - mean_b, var_a + var_b, welch, n_eff)


def one_sided(mean: float, var: float, users: int) -> Evidence:
    """A mean (with the variance of that mean, over `users` units) against zero."""
    if users < 2 or not math.isfinite(var):
        return NONE
    return _t_evidence(mean, max(var, 0.0), users - 1, users)


# Alternatives of a rate test: the null's odds times each of these (2 to about a million), weighted alike.
_ODDS_STEPS = tuple(2.0**j for j in range(1, 21))


def rate_above(hits: int, n: int, rate: float) -> Evidence:
    """`hits` of `n` against a rate of at most `rate` (H0): the binomial likelihood ratio averaged over
    alternatives whose odds are the null's times 2, 4, ... 2^20. Each such ratio, under any rate at or below
    `rate`, is a nonnegative supermartingale, so their mean is an e-value at every read; no variance is
    estimated, so every request failed (or none) is evidence like any other count. difference: the observed
    rate less `rate`."""
    if n <= 0 or not 0 <= hits <= n:
        return NONE
    observed = hits / n
    if rate <= 0:  # a rate of 0: one hit disproves it
        return Evidence(observed, Z95 * math.sqrt(observed * (1 - observed) / n), math.inf if hits else 1.0, n)
    if rate >= 1:
        return Evidence(observed - rate, math.inf, 1.0, n)
    odds = rate / (1 - rate)
    logs = []
    for step in _ODDS_STEPS:
        q = odds * step / (1 + odds * step)
        logs.append(hits * math.log(q / rate) + (n - hits) * (math.log1p(-q) - math.log1p(-rate)))
    top = max(logs)
    log_e = top + math.log(sum(math.exp(x - top) for x in logs) / len(logs))
    half = Z95 * math.sqrt(observed * (1 - observed) / n)
    return Evidence(observed - rate, half, math.exp(min(log_e, 700.0)), n)


def rate_rise(errors_a: int, n_a: int, errors_b: int, n_b: int) -> Evidence:
    """Side a's error rate against side b's, both counted over the same time (H0: a's is not higher). Given
    the errors, each falls on side a with at most a's share of the requests when a's rate is not higher,
    so it is `rate_above` over the errors with that share as the null. difference: a's rate less b's."""
    if min(n_a, n_b) <= 0:
        return NONE
    ev = rate_above(errors_a, errors_a + errors_b, n_a / (n_a + n_b))
    diff = errors_a / n_a - errors_b / n_b
    half = Z95 * math.sqrt(
        (errors_a / n_a) * (1 - errors_a / n_a) / n_a + (errors_b / n_b) * (1 - errors_b / n_b) / n_b
    )
    return Evidence(diff, half, ev.e_value, ev.df)


def signs(favour_a: int, favour_b: int) -> Evidence:
    """Users favouring side a against those favouring side b (ties left out), when either is as likely:
    difference = (a - b) / (a + b); worse: side a favoured less, beyond chance."""
    n = favour_a + favour_b
    if n == 0:
        return NONE
    log_e = (
        math.lgamma(favour_a + 0.5)
        + math.lgamma(favour_b + 0.5)
        - math.lgamma(n + 1)
        - math.lgamma(0.5) * 2
        + math.lgamma(1.0)
        + n * math.log(2)
    )
    return Evidence((favour_a - favour_b) / n, Z95 / math.sqrt(n), math.exp(min(log_e, 700.0)), n)
