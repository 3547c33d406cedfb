"""The loop's anytime-valid tests: an equal side found worse at most ALPHA of the time however often it is
looked at, a far worse one found on a few users, and each e-value equal to its closed form."""

from __future__ import annotations

import math
import random

from app.production.promotion import MIN_USERS, compared, per_user
from app.production.sequential import ALPHA, NONE, G, one_sided, signs, two_sided
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
    assert two_sided(0.1, 0.0, 20, 0.1, 0.0, 20) is NONE


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
