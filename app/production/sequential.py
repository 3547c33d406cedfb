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

    @property
    def worse(self) -> bool:
        """Proof that the tested side is lower, at ALPHA, whenever it is read."""
        return self.difference < 0 and self.e_value >= 1 / ALPHA


def _t_mixture(t: float, df: float, n_eff: float) -> float:
    """The mixture e-value of a t statistic with `df` degrees of freedom over `n_eff` effective units."""
    r = n_eff * G
    tt = t * t
    log_e = -0.5 * math.log1p(r) + (df + 1) / 2 * (math.log1p(tt / df) - math.log1p(tt / (df * (1 + r))))
    return math.exp(min(log_e, 700.0))


NONE = Evidence(0.0, math.inf, 1.0, 0.0)  # a read with too little to say anything


def two_sided(mean_a: float, var_a: float, users_a: int, mean_b: float, var_b: float, users_b: int) -> Evidence:
    """Side a against side b: each a mean with the variance of that mean and its users (the unit);
    difference = mean_a - mean_b. NONE while a side has fewer than two users or no spread at all."""
    if min(users_a, users_b) < 2 or not (math.isfinite(var_a) and math.isfinite(var_b)):
        return NONE
    var = var_a + var_b
    diff = mean_a - mean_b
    if var <= 0:
        return NONE
    welch = var * var / (var_a * var_a / (users_a - 1) + var_b * var_b / (users_b - 1))
    n_eff = users_a * users_b / (users_a + users_b)
    t = diff / math.sqrt(var)
    return Evidence(diff, Z95 * math.sqrt(var), _t_mixture(t, welch, n_eff), welch)


def one_sided(mean: float, var: float, users: int) -> Evidence:
    """A mean (with the variance of that mean, over `users` units) against zero."""
    if users < 2 or not math.isfinite(var) or var <= 0:
        return NONE
    t = mean / math.sqrt(var)
    return Evidence(mean, Z95 * math.sqrt(var), _t_mixture(t, users - 1, users), users - 1)


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
