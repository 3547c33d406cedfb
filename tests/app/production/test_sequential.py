"""The loop's anytime-valid tests: an equal side found worse at most ALPHA of the time however often it is
looked at, a far worse one found on a few users, and each e-value equal to its closed form."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from app.production.promotion import MIN_USERS, compared, per_user
from app.production.sequential import ALPHA, NONE, G, one_sided, rate_above, rate_rise, signs, two_sided
from app.store import UserStats

STATED = 0.05  # the false rollback rate the loop states (docs/decisions/sequential-tests.md)


def _aa_runs(runs: int, *, effect: float, users: int = 60, share: float = 0.25, lists: int = 1500) -> list[int | None]:
    """Two sides of one population (users' activity heavy-tailed: a handful send most lists; their hit rates
    far apart), the second side's hit rate times `effect`; the test read after every 10 lists. -> per run,
    the list at which it first found the second side worse (None: never)."""
    out: list[int | None] = []
    for seed in range(runs):
        rng = random.Random(seed)
        weight = [rng.paretovariate(1.2) for _ in range(users)]
        skill = [rng.uniform(0.05, 0.9) for _ in range(users)]
        first = [rng.random() < share for _ in range(users)]
        per: dict[int, tuple[float, float]] = {}
        a, b = UserStats(), UserStats()
        found = None
        for n in range(lists):
            u = rng.choices(range(users), weights=weight)[0]
            hit = rng.random() < skill[u] * (1.0 if first[u] else effect)
            x = rng.choice([1.0, 0.63, 0.5, 0.43, 0.39]) if hit else 0.0
            old = per.get(u)
            new = (old[0] + 1, old[1] + x) if old else (1.0, x)
            (a if first[u] else b).move(old, new)
            per[u] = new
            if n % 10 == 0 and compared(b, a).worse:
                found = n
                break
        out.append(found)
    return out


def test_an_equal_side_is_found_worse_at_most_at_the_stated_rate_however_often_it_is_read() -> None:
    found = [n for n in _aa_runs(300, effect=1.0) if n is not None]
    assert len(found) <= STATED * 300, len(found)  # 150 looks a run; a fixed 95% interval read so errs far more


def test_a_fixed_interval_read_at_every_look_errs_far_more_often() -> None:
    """Why the tests are sequential: the same kind of runs, a fixed 95% interval of the users' means read
    after every 10 lists (as the rule and probation read theirs before)."""
    wrong = 0
    for seed in range(300):
        rng = random.Random(seed)
        a, b = UserStats(), UserStats()
        per: dict[int, tuple[float, float]] = {}
        for n in range(1500):
            u = rng.randrange(60)
            x = rng.choice([1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
            old = per.get(u)
            new = (old[0] + 1, old[1] + x) if old else (1.0, x)
            (a if u % 4 == 0 else b).move(old, new)
            per[u] = new
            if n % 10 == 0 and min(a.users, b.users) >= MIN_USERS:
                (ma, va), (mb, vb) = per_user(a), per_user(b)
                if mb - ma < -1.959964 * math.sqrt(va + vb):
                    wrong += 1
                    break
    assert wrong > 2 * STATED * 300, wrong


def test_a_hundredfold_worse_side_is_found_in_most_runs_within_a_few_hundred_lists() -> None:
    """The runs it misses are those where one or two users carry a side: no test can tell them apart."""
    found = _aa_runs(60, effect=0.01)
    caught = sorted(n for n in found if n is not None)
    assert len(caught) >= 0.7 * len(found), found
    assert caught[len(caught) // 2] <= 1000, caught


def test_two_sides_e_value_is_the_t_mixture_in_closed_form() -> None:
    # Side a: mean 0.1, variance of the mean 0.0004 over 20 users; side b: 0.2, 0.0009 over 10.
    ev = two_sided(0.1, 0.0004, 20, 0.2, 0.0009, 10)
    var = 0.0013
    t, df = -0.1 / math.sqrt(var), var**2 / (0.0004**2 / 19 + 0.0009**2 / 9)
    r = 20 * 10 / 30 * G
    want = (1 + r) ** -0.5 * ((1 + t * t / df) / (1 + t * t / (df * (1 + r)))) ** ((df + 1) / 2)
    assert math.isclose(ev.e_value, want, rel_tol=1e-12) and math.isclose(ev.df, df)
    assert math.isclose(ev.difference, -0.1) and math.isclose(ev.half_width, 1.959964 * math.sqrt(var))
    assert ev.worse == (want >= 1 / ALPHA)
    assert two_sided(0.2, 0.0009, 10, 0.1, 0.0004, 20).worse is False  # higher is never worse
    assert two_sided(0.1, 0.0004, 1, 0.2, 0.0009, 10) is NONE  # one user: no variance to read
    alike = two_sided(0.1, 0.0, 20, 0.1, 0.0, 20)  # two constant sides, equal: no evidence of a difference
    assert alike.e_value < 1 and not alike.worse and alike.half_width_anytime == 0.0


def test_one_side_against_zero_is_the_one_sample_mixture() -> None:
    ev = one_sided(-0.05, 0.0001, 12)
    t, r = -0.05 / 0.01, 12 * G
    want = (1 + r) ** -0.5 * ((1 + t * t / 11) / (1 + t * t / (11 * (1 + r)))) ** 6
    assert math.isclose(ev.e_value, want, rel_tol=1e-12) and ev.worse
    assert one_sided(0.05, 0.0001, 12).worse is False
    assert one_sided(-0.05, 0.0001, 1) is NONE


def test_the_sign_tests_e_value_is_the_binomial_mixture_under_jeffreys_prior() -> None:
    """Users favouring each side: E = integral of p^a (1-p)^b over Beta(1/2, 1/2), over 2^-n."""

    def mixture(a: int, b: int) -> float:
        steps = 200_000  # midpoint rule on p = sin^2(theta), which takes the prior's ends away
        total = 0.0
        for i in range(steps):
            theta = (i + 0.5) / steps * math.pi / 2
            p = math.sin(theta) ** 2
            total += p**a * (1 - p) ** b * (2 / math.pi) * (math.pi / 2 / steps)
        return total * 2 ** (a + b)

    for a, b in ((3, 9), (0, 12), (7, 7)):
        assert math.isclose(signs(a, b).e_value, mixture(a, b), rel_tol=1e-6), (a, b)
    assert signs(2, 18).worse and not signs(18, 2).worse and signs(0, 0) is NONE


# Variances a side can hold: none, subnormal, underflowing when squared, ordinary, large.
_SPREADS = st.sampled_from([0.0, 5e-324, 1e-320, 1e-160, 1e-154, 1e-12, 1e-4, 0.25, 1e6])
_MEANS = st.one_of(st.sampled_from([0.0, 1.0, 0.25, 1e-300]), st.floats(-1e6, 1e6, allow_nan=False))


@settings(max_examples=400, deadline=None)
@given(_MEANS, _SPREADS, st.integers(2, 5000), _MEANS, _SPREADS, st.integers(2, 5000))
def test_two_sides_never_raise_nor_give_nan_and_an_exact_gap_is_proved(
    ma: float, va: float, ua: int, mb: float, vb: float, ub: int
) -> None:
    """Degenerate spreads (none, underflowing, constant sides): an e-value that is a number, never an exception;
    a gap with no spread at all on either side is proof once each side has MIN_USERS users."""
    ev = two_sided(ma, va, ua, mb, vb, ub)
    assert not math.isnan(ev.e_value) and ev.e_value >= 0 and not math.isnan(ev.half_width_anytime)
    assert ev.df > 0 and math.isfinite(ev.df)
    if va == vb == 0.0 and ma < mb and min(ua, ub) >= MIN_USERS:
        assert ev.worse, ev
    if ma >= mb:
        assert not ev.worse
    if ma == mb and va == vb == 0.0:
        assert ev.e_value < 1


@settings(max_examples=300, deadline=None)
@given(_MEANS, _SPREADS, st.integers(2, 5000))
def test_one_side_never_raises_nor_gives_nan_and_an_exact_gap_is_proved(mean: float, var: float, users: int) -> None:
    ev = one_sided(mean, var, users)
    assert not math.isnan(ev.e_value) and ev.e_value >= 0
    if var == 0.0 and mean < 0 and users >= MIN_USERS:
        assert ev.worse, ev  # a floor gap of exactly -1 per user: proved


def test_the_anytime_interval_holds_what_the_e_value_would_not_reject() -> None:
    """The confidence sequence's ends are where the e-value for "the difference is d" reaches 1 / ALPHA; too few
    users to reach it even for an exact difference: unbounded."""
    ev = two_sided(0.2, 0.0004, 30, 0.25, 0.0004, 30)
    for end, inside in (
        (ev.difference - ev.half_width_anytime, False),
        (ev.difference - 0.99 * ev.half_width_anytime, True),
    ):
        shifted = two_sided(0.2 - end, 0.0004, 30, 0.25, 0.0004, 30)  # tests "the difference is `end`"
        assert (shifted.e_value < 1 / ALPHA) == inside
    assert ev.half_width_anytime > ev.half_width  # wider than the fixed-sample interval, as it must be
    assert math.isinf(two_sided(0.2, 0.0004, 2, 0.25, 0.0004, 2).half_width_anytime)


def test_a_rate_is_tested_on_its_counts() -> None:
    """The mean over alternatives of the binomial likelihood ratio, by hand; every request failed against none
    of the holdback's is proved on a few dozen; a rate within its null never is."""
    hits, n, p0 = 7, 200, 0.01
    odds = p0 / (1 - p0)
    terms = []
    for j in range(1, 21):
        q = odds * 2**j / (1 + odds * 2**j)
        terms.append((q / p0) ** hits * ((1 - q) / (1 - p0)) ** (n - hits))
    assert math.isclose(rate_above(hits, n, p0).e_value, sum(terms) / 20, rel_tol=1e-9)
    assert rate_above(0, 1000, p0).e_value < 1
    all_failed = next(n for n in range(1, 500) if rate_rise(n, n, 0, max(1, n // 9)).e_value >= 1 / ALPHA)
    assert all_failed <= 60, all_failed  # a 10% holdback: about 55 answers of the new version
    assert rate_rise(10, 1000, 10, 1000).e_value < 1 and not rate_rise(0, 10, 5, 10).difference > 0


def test_a_rate_at_its_null_is_proved_above_it_at_most_alpha_of_the_time_however_often_it_is_read() -> None:
    wrong = 0
    for seed in range(400):
        rng = random.Random(seed)
        hits = 0
        for n in range(1, 2001):
            hits += rng.random() < 0.02
            if n % 10 == 0 and rate_above(hits, n, 0.02).e_value >= 1 / ALPHA:
                wrong += 1
                break
    assert wrong <= 2 * ALPHA * 400, wrong  # Ville: at most ALPHA; twice it for the runs' own noise
