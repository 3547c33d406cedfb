"""Each version's answers (count, 5xx, latency histogram) and what probation reads of them."""

from __future__ import annotations

import pytest

from app.promotion import probation_findings
from app.settings import Settings
from app.store import Candidate, Sums, Traffic, UserStats
from app.store.state import LATENCY_EDGES_S
from app.traffic import VersionTraffic

PROMOTED = 1_800_000_000.0
CAND = Candidate("v2", "canary", 0.5, PROMOTED - 600, "promoted", PROMOTED, replaced="v1")
NONE = UserStats()


def test_answers_are_tallied_per_version_and_minute_until_taken() -> None:
    tally = VersionTraffic()
    tally.observe("m", "v1", 200, 0.0009, now=PROMOTED + 5)  # under the first edge: bucket 0
    tally.observe("m", "v1", 503, 0.0011, now=PROMOTED + 59)  # just over 1 ms: bucket 1
    tally.observe("m", "v2", 200, 100.0, now=PROMOTED + 61)  # past the last edge: the bucket after it
    rows = tally.take()
    assert rows[("m", "v1", PROMOTED)] == Traffic(2, 1, {0: 1.0, 1: 1.0})
    assert rows[("m", "v2", PROMOTED + 60)] == Traffic(1, 0, {len(LATENCY_EDGES_S): 1.0})
    assert tally.take() == {}


def test_a_quantile_is_the_upper_edge_of_its_bucket() -> None:
    t = Traffic(100, 0, {2: 98.0, 10: 1.0, 20: 1.0})
    assert t.quantile(0.5) == LATENCY_EDGES_S[2]
    assert t.quantile(0.99) == pytest.approx(0.001 * 1.25**10)  # the 99th of 100 answers is in bucket 10
    assert t.quantile(1.0) == LATENCY_EDGES_S[20]
    assert Traffic().quantile(0.99) is None
    assert Traffic(1, 0, {len(LATENCY_EDGES_S): 1.0}).quantile(0.99) == LATENCY_EDGES_S[-1]


def _settings(**kw: float) -> Settings:
    return Settings(probation_s=3600.0, probation_min_requests=200, **kw)


def _traffic(old: Traffic, new: Traffic) -> dict[tuple[str, str, float], Traffic]:
    return {("m", "v1", PROMOTED - 120): old, ("m", "v2", PROMOTED + 60): new}


def test_probation_finds_a_5xx_rise_beyond_its_bound_and_beyond_chance() -> None:
    fast = {3: 1.0}
    old = Traffic(1000, 2, {3: 1000.0})
    assert (
        probation_findings(
            CAND, {}, _traffic(old, Traffic(1000, 10, {3: 1000.0})), users=NONE, holdback=None, settings=_settings()
        )
        == []
    )
    found = probation_findings(
        CAND, {}, _traffic(old, Traffic(1000, 40, {3: 1000.0})), users=NONE, holdback=None, settings=_settings()
    )
    assert len(found) == 1 and found[0].startswith("5xx share 0.0400 of 1000 answers") and "0.0020 of 1000" in found[0]
    # A rise past the bound on too few answers to tell from chance is not acted on.
    few = _traffic(Traffic(200, 0, fast), Traffic(200, 3, fast))
    assert probation_findings(CAND, {}, few, users=NONE, holdback=None, settings=_settings()) == []
    # Nor on fewer answers than probation_min_requests a side.
    short = _traffic(Traffic(199, 0, fast), Traffic(500, 400, fast))
    assert probation_findings(CAND, {}, short, users=NONE, holdback=None, settings=_settings()) == []


def test_probation_finds_a_p99_above_its_ratio() -> None:
    old = Traffic(1000, 0, {10: 990.0, 12: 10.0})  # p99: the edge of bucket 10
    same = Traffic(1000, 0, {10: 985.0, 11: 15.0})  # p99 one step (25%) up: within 1.5x
    slow = Traffic(1000, 0, {10: 900.0, 13: 100.0})  # three steps: 1.95x
    assert probation_findings(CAND, {}, _traffic(old, same), users=NONE, holdback=None, settings=_settings()) == []
    found = probation_findings(CAND, {}, _traffic(old, slow), users=NONE, holdback=None, settings=_settings())
    assert len(found) == 1 and found[0].startswith("p99 latency 18.2 ms over 1000 answers") and "9.3 ms" in found[0]
    # Answers of other versions, or outside the windows, count for neither side.
    noise = {("m", "v9", PROMOTED + 60): Traffic(5000, 5000, {40: 5000.0}), ("m", "v1", PROMOTED - 7200): slow}
    assert (
        probation_findings(CAND, {}, _traffic(old, same) | noise, users=NONE, holdback=None, settings=_settings()) == []
    )


def test_probation_reads_the_new_version_s_online_figure_per_user() -> None:
    """The new side's NDCG@10 interval takes users as the unit (one user's lists move together), and it
    needs SEQSERVE_PROBATION_MIN_USERS: 300 lists from a dozen users say little however low they are."""

    def sums(n: int, mean: float) -> Sums:
        return Sums(n=n, ndcg=n * mean, ndcg2=n * (mean * mean + 0.01))

    online = {("m", "v1", "live", PROMOTED - 600, "known"): sums(300, 0.30)}
    worse = UserStats.of([(10.0, 1.0 + (u % 3) * 0.1) for u in range(40)])  # 400 lists at 0.1098
    found = probation_findings(CAND, online, {}, users=worse, holdback=None, settings=_settings())
    assert len(found) == 1 and found[0].startswith("online NDCG@10 0.1098 over 400 lists of 40 users"), found
    few = UserStats.of([(25.0, 0.0)] * 12)  # 300 lists at 0, from 12 users
    assert probation_findings(CAND, online, {}, users=few, holdback=None, settings=_settings()) == []
    assert (
        probation_findings(CAND, online, {}, users=few, holdback=None, settings=_settings(probation_min_users=12)) != []
    )
    # As good within the interval: kept. The old side's other versions and spans count for nothing.
    peer = UserStats.of([(10.0, 2.5 + (u % 3) * 1.0) for u in range(40)])
    noise = {
        ("m", "v9", "live", PROMOTED - 600, "known"): sums(900, 0.0),
        ("m", "v1", "live", PROMOTED + 60, ""): sums(900, 0.0),
    }
    assert probation_findings(CAND, online | noise, {}, users=peer, holdback=None, settings=_settings()) == []


def test_with_a_holdback_probation_compares_both_sides_over_the_same_time_users_as_the_unit() -> None:
    """The replaced version's users kept on it since the promotion are the other side: the span before the
    promotion is not read at all, and each side needs SEQSERVE_PROBATION_MIN_USERS users."""
    before = {("m", "v1", "live", PROMOTED - 600, "known"): Sums(n=900, ndcg=900 * 0.9, ndcg2=900 * 0.82)}
    new = UserStats.of([(10.0, 2.0 + (u % 3) * 0.2) for u in range(40)])  # 400 lists at 0.2195
    held_same = UserStats.of([(10.0, 2.0 + ((u + 1) % 3) * 0.2) for u in range(30)])  # 300 lists at 0.22
    # Far below the span before the promotion, level with the holdback: kept.
    assert probation_findings(CAND, before, {}, users=new, holdback=held_same, settings=_settings()) == []
    held_better = UserStats.of([(10.0, 4.0 + (u % 3) * 0.2) for u in range(30)])  # 0.42
    found = probation_findings(CAND, {}, {}, users=new, holdback=held_better, settings=_settings())
    assert len(found) == 1, found
    assert found[0].startswith("online NDCG@10 0.2195 over 400 lists of 40 users since promotion against 0.4200"), found
    assert "300 lists of 30 users kept on v1 (the holdback)" in found[0]
    # Fewer holdback users than the bound, or fewer lists: nothing said yet, however far apart.
    few = UserStats.of([(10.0, 4.0)] * 29)
    assert probation_findings(CAND, {}, {}, users=new, holdback=few, settings=_settings()) == []
    short = UserStats.of([(6.0, 2.4)] * 30)  # 180 lists
    assert probation_findings(CAND, {}, {}, users=new, holdback=short, settings=_settings()) == []
    # Within the interval (users as the unit: 30 users whose means spread widely), kept.
    spread = UserStats.of([(10.0, 0.0 if u % 2 else 6.0) for u in range(30)])  # 0.30, half the users at 0
    assert probation_findings(CAND, {}, {}, users=new, holdback=spread, settings=_settings()) == []
