"""Each version's answers (count, failures, cost histogram) and what probation decides from them and from its
sides' per-user online figures: never undecided, rolled back on proof, confirmed on evidence."""

from __future__ import annotations

import pytest

from app.production.promotion import Sides, probation, probation_sides
from app.production.traffic import VersionTraffic
from app.settings import ProbationPolicy, Settings
from app.store import Candidate, Traffic, UserStats
from app.store.state import LATENCY_EDGES_S, TrialEnd

PROMOTED = 1_800_000_000.0
CAND = Candidate("v2", "canary", 0.5, PROMOTED - 600, TrialEnd("promoted", PROMOTED, "v1"))
NO_TRAFFIC = Traffic()


def test_answers_are_tallied_per_version_and_minute_until_taken() -> None:
    tally = VersionTraffic()
    tally.observe("m", "v1", failed=False, seconds=0.00009, now=PROMOTED + 5)  # under the first edge: bucket 0
    tally.observe("m", "v1", failed=True, seconds=0.00011, now=PROMOTED + 59)  # just over 0.1 ms: bucket 1
    tally.observe("m", "v2", failed=False, seconds=100.0, now=PROMOTED + 61)  # past the last edge: the one after
    rows = tally.take()
    assert rows[("m", "v1", PROMOTED)] == Traffic(2, 1, {0: 1.0, 1: 1.0})
    assert rows[("m", "v2", PROMOTED + 60)] == Traffic(1, 0, {len(LATENCY_EDGES_S): 1.0})
    assert tally.take() == {}


def test_a_quantile_is_the_upper_edge_of_its_bucket() -> None:
    t = Traffic(100, 0, {2: 98.0, 10: 1.0, 20: 1.0})
    assert t.quantile(0.5) == LATENCY_EDGES_S[2]
    assert t.quantile(0.99) == pytest.approx(0.0001 * 1.25**10)  # the 99th of 100 answers is in bucket 10
    assert t.quantile(1.0) == LATENCY_EDGES_S[20]
    assert Traffic().quantile(0.99) is None
    assert Traffic(1, 0, {len(LATENCY_EDGES_S): 1.0}).quantile(0.99) == LATENCY_EDGES_S[-1]


def _settings(**kw: float) -> ProbationPolicy:
    values = {"probation_s": 3600.0, "probation_max_s": 7200.0, "probation_min_requests": 200}
    return Settings(**(values | kw)).probation


def _users(pairs: list[tuple[float, float]]) -> UserStats:
    return UserStats.of(pairs)


def _sides(
    live: UserStats | None,
    *,
    holdback: UserStats | None = None,
    floor: UserStats | None = None,
    served: tuple[Traffic, Traffic | None] = (NO_TRAFFIC, None),
) -> Sides:
    return Sides(live=live, floor=floor, holdback=holdback, served_live=served[0], served_holdback=served[1])


GOOD = _users([(10.0, 2.0 + (u % 3) * 0.2) for u in range(40)])  # 400 lists at 0.2195 from 40 users
LEVEL = _users([(10.0, 2.0 + ((u + 1) % 3) * 0.2) for u in range(30)])  # 300 lists at 0.22
ABOVE_FLOOR = _users([(10.0, 1.0 + (u % 3) * 0.2) for u in range(40)])  # 0.12 a list above its reference


def test_a_version_far_worse_than_its_holdback_is_rolled_back_on_a_few_heavy_users_at_once() -> None:
    """The heavy-user log's case: 36 users on the new version against 15 on the holdback, a hundredfold gap.
    The rule's minimum of 30 users a side left it undecided; the anytime-valid test needs no minimum."""
    broken = _users([(40.0 + 5 * (u % 4), 0.04 * ((u % 3) - 1) + 0.05) for u in range(36)])  # about 0.001 a list
    holdback = _users([(40.0, 4.24 + 0.4 * ((u % 5) - 2)) for u in range(15)])  # 0.106 a list
    got = probation(CAND, _sides(broken, holdback=holdback), now=PROMOTED + 120, settings=_settings())
    assert got.action == "roll_back", got
    assert got.reason.startswith("users' mean online NDCG@10 -0.10") and "against its holdback (v1)" in got.reason
    assert "users as the unit: 36 and 15" in got.reason
    # The replay's case: six heavy users kept on the holdback against thirty-seven. A mixture over few users is
    # capped whatever the gap; it must still reach proof here.
    six = _users([(55.0 - 6 * u, (55.0 - 6 * u) * (0.55 + 0.15 * (u % 3))) for u in range(6)])
    shuffled = _users([(30.0 + u, (30.0 + u) * (0.03 + 0.004 * (u % 4))) for u in range(37)])
    got = probation(CAND, _sides(shuffled, holdback=six), now=PROMOTED + 60, settings=_settings())
    assert got.action == "roll_back", got
    # Four holdback users are too few to decide anything on (app.promotion.MIN_USERS).
    lone = _users([(40.0, 4.24 + 0.1 * u) for u in range(4)])
    assert probation(CAND, _sides(broken, holdback=lone), now=PROMOTED + 120, settings=_settings()).action == "wait"


def test_probation_waits_for_its_evidence_confirms_on_it_and_rolls_back_at_its_bound() -> None:
    """Never undecided: level with its holdback and above its floor, confirmed once PROBATION_S has passed with
    every side's lists in; without them by PROBATION_MAX_S, rolled back (an operator can promote by hand)."""
    s = _settings()
    ready = _sides(GOOD, holdback=LEVEL, floor=ABOVE_FLOOR)
    early = probation(CAND, ready, now=PROMOTED + 60, settings=s)
    assert early.action == "wait" and "3540 s of SEQSERVE_PROBATION_S left" in early.reason
    assert probation(CAND, ready, now=PROMOTED + 3600, settings=s).action == "confirm"
    thin = _users([(10.0, 2.2)] * 4)  # 40 lists from 4 users: under 200 lists and 5 users
    waiting = probation(CAND, _sides(GOOD, holdback=thin, floor=ABOVE_FLOOR), now=PROMOTED + 3600, settings=s)
    assert waiting.action == "wait"
    assert waiting.reason == "the holdback's lists: 40 of 4 users, 200 lists of 5 users needed", waiting.reason
    bound = probation(CAND, _sides(GOOD, holdback=thin, floor=ABOVE_FLOOR), now=PROMOTED + 7200, settings=s)
    assert bound.action == "roll_back" and bound.reason.startswith("undecided after 7200 s (SEQSERVE_PROBATION_MAX_S)")
    # A model whose answers are not scored (or events without a key) reads no NDCG@10: time alone confirms it.
    unscored = probation_sides(CAND, {}, {}, scored=False, held=True)
    assert (unscored.live, unscored.floor, unscored.holdback) == (None, None, None)
    assert probation(CAND, unscored, now=PROMOTED + 3600, settings=s).action == "confirm"


def test_a_version_below_its_own_reference_lists_is_rolled_back_without_a_holdback() -> None:
    """The floor: per user, each list's NDCG@10 less its reference list's (its popularity, the same exclusions,
    the same event): a version worse than counting is found with no other version to compare with."""
    below = _users([(20.0, -1.0 - 0.3 * (u % 4)) for u in range(12)])  # 0.065 a list under its reference
    got = probation(CAND, _sides(GOOD, floor=below), now=PROMOTED + 60, settings=_settings())
    assert got.action == "roll_back" and "against its own reference lists" in got.reason, got
    level = _users([(20.0, 0.3 * ((u % 3) - 1)) for u in range(12)])
    assert probation(CAND, _sides(GOOD, floor=level), now=PROMOTED + 60, settings=_settings()).action == "wait"


def test_the_answers_are_compared_with_the_holdbacks_over_the_same_time() -> None:
    """5xx share proved higher by more than its bound, or a p99 past its ratio, against the holdback's answers
    since the promotion: the span before it (another load, another hour) is never read."""
    fast = {3: 1000.0}
    old = Traffic(1000, 2, dict(fast))
    failing = Traffic(1000, 40, dict(fast))
    got = probation(CAND, _sides(None, served=(failing, old)), now=PROMOTED + 60, settings=_settings())
    assert got.action == "roll_back" and got.reason.startswith("5xx share 0.0400 of 1000 answers"), got
    # Within the bound, or without a holdback to compare with: nothing found.
    some = Traffic(1000, 10, dict(fast))
    assert probation(CAND, _sides(None, served=(some, old)), now=PROMOTED + 60, settings=_settings()).action == "wait"
    assert (
        probation(CAND, _sides(None, served=(failing, None)), now=PROMOTED + 60, settings=_settings()).action == "wait"
    )
    slow = Traffic(1000, 0, {10: 900.0, 13: 100.0})  # p99 three steps up: 1.95x
    base = Traffic(1000, 0, {10: 990.0, 12: 10.0})
    got = probation(CAND, _sides(None, served=(slow, base)), now=PROMOTED + 60, settings=_settings())
    assert got.action == "roll_back" and got.reason.startswith("p99 latency 1.8 ms over 1000 answers"), got
    short = Traffic(199, 0, {10: 199.0})  # fewer than probation_min_requests on the holdback's side
    assert probation(CAND, _sides(None, served=(slow, short)), now=PROMOTED + 60, settings=_settings()).action == "wait"


def test_probations_sides_read_the_store_under_the_promotion_and_count_only_the_two_versions() -> None:
    stats = {("v2", "live"): GOOD, ("v1", "holdback"): LEVEL, ("v2", "floor"): ABOVE_FLOOR, ("v9", "live"): LEVEL}
    traffic = {
        ("m", "v2", PROMOTED): Traffic(10, 1, {3: 10.0}),  # the minute the promotion landed in counts
        ("m", "v1", PROMOTED + 60): Traffic(5, 0, {3: 5.0}),
        ("m", "v1", PROMOTED - 120): Traffic(900, 900, {3: 900.0}),  # before it: not read
        ("m", "v9", PROMOTED + 60): Traffic(900, 900, {3: 900.0}),  # another version
    }
    sides = probation_sides(CAND, stats, traffic, scored=True, held=True)
    assert (sides.live, sides.holdback, sides.floor) == (GOOD, LEVEL, ABOVE_FLOOR)
    assert sides.served_live == Traffic(10, 1, {3: 10.0})
    assert sides.served_holdback == Traffic(5, 0, {3: 5.0})
    alone = probation_sides(CAND, stats, traffic, scored=True, held=False)
    assert alone.holdback is None and alone.served_holdback is None
