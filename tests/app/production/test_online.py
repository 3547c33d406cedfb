"""Served lists and their scores: what an arrival scores, what it drops, the bounds, the rule."""

from __future__ import annotations

import math

import pytest

from app.production.online import (
    LISTS_PER_USER,
    ServedList,
    ServedLists,
    exposure_of,
    figures,
    score,
    totals,
)
from app.production.promotion import judge, per_user
from app.production.trials import in_canary
from app.store import Arrival, Exposure, Sums, UserStats


def served(items: str, at: float, *, model: str = "m", variant: str = "live", version: str = "v1") -> ServedList:
    return ServedList(model, version, variant, tuple(items.split()), at)


def test_score_by_rank() -> None:
    assert score(["a", "b", "c"], "c").values() == pytest.approx((1, 1, 0.5, 0.25, 1 / 3, 0))
    assert score(["a"], "z").values() == (1, 0, 0, 0, 0, 0)
    eleventh = score([str(n) for n in range(20)], "10")  # rank 11: outside @10, still in MRR
    assert (eleventh.hits, eleventh.ndcg, eleventh.rr) == (0, 0, pytest.approx(1 / 11))


def test_an_arrival_scores_the_newest_list_before_it_once() -> None:
    lists = ServedLists(window_s=100, max_lists=100)
    lists.record("ns", "u", served("a b", 10))
    lists.record("ns", "u", served("b a", 20))  # a reload of the page: supersedes the first
    lists.record("ns", "u", served("c", 20, variant="shadow", version="v2"))
    lists.record("ns", "u", served("x y", 40))  # served after the event: waits for the next one
    got = lists.score([Arrival("ns", "u", "a", 30)])
    assert sorted((s.variant, s.items, sc.rr) for s, sc, _ in got) == [
        ("live", ("b", "a"), 0.5),
        ("shadow", ("c",), 0.0),
    ]
    assert lists.score([Arrival("other-ns", "u", "x", 50)]) == []  # namespaces apart
    again = lists.score([Arrival("ns", "u", "x", 50)])
    assert [(s.items, sc.hits) for s, sc, _ in again] == [(("x", "y"), 1)]
    tally = lists.take()
    assert tally.superseded == 1 and lists.size == 0
    assert tally.sums[("m", "v1", "live", 0.0, "")].n == 2  # per model, version, variant and minute


def test_an_event_naming_a_recommendation_id_scores_that_list_and_only_its_user_s() -> None:
    lists = ServedLists(window_s=100, max_lists=100)
    lists.record("ns", "u", ServedList("m", "v1", "live", ("a", "b"), 10, recommendation_id="r1"))
    lists.record("ns", "u", ServedList("m", "v1", "live", ("c", "d"), 20, recommendation_id="r2"))
    lists.record("ns", "w", ServedList("m", "v1", "live", ("a",), 20, recommendation_id="w1"))
    got = lists.score([Arrival("ns", "u", "b", 30, recommendation_id="r1")])  # taken from the older list
    assert [(s.recommendation_id, sc.rr, sc.attributed) for s, sc, _ in got] == [("r1", 0.5, 1)]
    assert lists.size == 1  # both of u's lists are done with: the one named, and the one it stands in for
    # Another user's id names nothing of this user's: the next-event rule scores w's own newest list.
    lists.record("ns", "u", ServedList("m", "v1", "live", ("a",), 40, recommendation_id="r3"))
    got = lists.score([Arrival("ns", "w", "a", 50, recommendation_id="r3")])
    assert [(s.recommendation_id, sc.hits, sc.attributed) for s, sc, _ in got] == [("w1", 1, 0)]
    got = lists.score([Arrival("ns", "u", "zz", 60, recommendation_id="gone")])  # unknown id: the newest
    assert [(s.recommendation_id, sc.attributed) for s, sc, _ in got] == [("r3", 0)]
    assert lists.take().sums[("m", "v1", "live", 0.0, "")].attributed == 1


def test_an_interleaved_list_credits_the_side_that_alone_held_the_item_per_user() -> None:
    lists = ServedLists(window_s=100, max_lists=100)

    def mixed(user: str, at: float) -> None:  # x: the candidate's alone, y: the live version's, z: both lists'
        lists.record("ns", user, ServedList("m", "v2", "interleave", ("x", "y", "z"), at, 5.0, "CLB"))

    for user, items in (("u", ["x", "x", "y"]), ("w", ["y", "z"]), ("v", ["z"])):
        for n, item in enumerate(items):
            mixed(user, 10 * n)
            lists.score([Arrival("ns", user, item, 10 * n + 1)])
    tally = lists.take()
    assert tally.users == {
        ("m", 5.0, "v2", "interleave", "u"): [3, 1],  # +1 +1 -1
        ("m", 5.0, "v2", "interleave", "w"): [2, -1],  # -1, then an item both held: 0
        ("m", 5.0, "v2", "interleave", "v"): [1, 0],
    }
    assert tally.credits == {("m", "candidate"): 2, ("m", "live"): 2, ("m", "neither"): 2}
    assert tally.sums[("m", "v2", "interleave", 0.0, "")].n == 6  # the mixed lists' own figures, as served


def test_a_list_older_than_the_window_is_not_scored_and_expires() -> None:
    lists = ServedLists(window_s=10, max_lists=100)
    lists.record("ns", "u", served("a", 0))
    lists.record("ns", "w", served("a", 50))
    assert lists.score([Arrival("ns", "u", "a", 20)]) == []
    lists.expire(now=55)
    assert lists.size == 1 and lists.take().expired == 1  # u's list, past the window; w's is fresh
    lists.expire(now=70)
    assert lists.size == 0 and lists.take().expired == 1


def test_lists_are_bounded_per_user_and_in_total() -> None:
    lists = ServedLists(window_s=100, max_lists=LISTS_PER_USER + 2)
    for n in range(LISTS_PER_USER + 3):
        lists.record("ns", "u", served("a", n))
    assert lists.size == LISTS_PER_USER
    for n in range(5):
        lists.record("ns", f"w{n}", served("a", 50))
    assert lists.size == 5  # the total passed: the user touched longest ago lost all its lists
    assert lists.take().evicted == 3 + LISTS_PER_USER
    assert lists.score([Arrival("ns", "u", "a", 60)]) == []


def test_canary_share_is_about_right_and_differs_per_model() -> None:
    users = [f"user-{n}" for n in range(20_000)]
    picked = [u for u in users if in_canary("sasrec", u, 0.1)]
    assert 0.09 < len(picked) / len(users) < 0.11
    assert set(picked) != {u for u in users if in_canary("bert4rec", u, 0.1)}
    assert all(in_canary("sasrec", u, 0.2) for u in picked)  # a larger share keeps the users it had


def test_figures_and_intervals() -> None:
    f = figures(Sums(n=100, hits=30, ndcg=20, ndcg2=8, rr=25))
    assert f is not None and (f.hr10, f.ndcg10, f.mrr) == (0.3, 0.2, 0.25)
    sd = math.sqrt((8 - 100 * 0.04) / 99)
    assert f.ndcg10_ci == pytest.approx((0.2 - 1.959964 * sd / 10, 0.2 + 1.959964 * sd / 10))
    assert f.hr10_ci[0] < 0.3 < f.hr10_ci[1]
    assert figures(Sums()) is None
    rows = {("m", "v1", "live", 0.0, "known"): Sums(n=1), ("m", "v1", "live", 120.0, "new"): Sums(n=2)}
    assert totals(rows, since=100)[("v1", "live")].n == 2


def test_the_rule_waits_then_promotes_a_peer_and_retires_a_worse_one() -> None:
    """A peer is promoted once the anytime interval's lower end clears the margin (10% of the live mean): on
    100 users a side, not on 40 (the interval there reaches 0.034 below, past the margin's 0.025)."""
    live = [(10.0, 2.0 + (u % 3) * 0.5) for u in range(100)]  # 100 users, 10 lists each, NDCG@10 about 0.25
    peer = [(10.0, 2.0 + ((u + 1) % 3) * 0.5) for u in range(100)]
    worse = [(10.0, 0.2 + (u % 3) * 0.1) for u in range(40)]
    assert judge(UserStats.of(peer[:5]), UserStats.of(live), min_events=100).action == "wait"
    assert judge(UserStats.of(peer), UserStats.of(live), min_events=100).action == "promote"
    near = judge(UserStats.of(peer[:40]), UserStats.of(live[:40]), min_events=100)
    assert near.action == "wait" and "not shown within the margin" in near.reason
    assert judge(UserStats.of(peer[:40]), UserStats.of(live[:40]), min_events=100, margin=0.2).action == "promote"
    assert judge(UserStats.of(worse), UserStats.of(live), min_events=100).action == "retire"


def test_the_rule_proves_a_gap_between_sides_without_spread() -> None:
    """Every list of the candidate scoring 0 against a live version at exactly 1.0 (both variances 0): retired,
    not promoted on "difference +0.0000"; two constant sides alike: promoted (the difference is exact)."""
    zero = UserStats.of([(10.0, 0.0)] * 40)
    one = UserStats.of([(10.0, 10.0)] * 40)
    got = judge(zero, one, min_events=100)
    assert got.action == "retire" and got.figures["difference"] == -1.0, got
    assert judge(one, one, min_events=100).action == "promote"
    assert judge(one, zero, min_events=100).action == "promote"  # better is never retired


def test_the_rule_counts_users_not_lists() -> None:
    """Each user counts once, whatever their lists: two heavy users served worse are two users of 42, not 400
    independent lists, and prove nothing; a gap over every user does. A side's mean over lists would follow
    its heaviest users (the ratio estimator), whose clustered variance collapses when a few carry a side."""
    live = [(10.0, 2.5)] * 40 + [(200.0, 40.0), (200.0, 60.0)]
    cand = [(10.0, 2.5)] * 40 + [(200.0, 32.0), (200.0, 32.0)]
    assert per_user(UserStats.of(cand))[0] == pytest.approx((40 * 0.25 + 2 * 0.16) / 42)
    assert judge(UserStats.of(cand), UserStats.of(live), min_events=100).action == "promote"
    everyone = [(10.0, 1.45 + (u % 2) * 0.1) for u in range(40)] + [(200.0, 30.0), (200.0, 30.0)]
    assert judge(UserStats.of(everyone), UserStats.of(live), min_events=100).action == "retire"


def test_running_sums_give_the_weighted_mean_and_variance_of_the_users_means() -> None:
    """Each user's mean weighted by their lists up to WEIGHT_CAP (10): by hand, users as the unit."""
    pairs = [(1.0 + u % 13, 0.3 * (u % 5) + 0.01 * u) for u in range(50)]
    weights = [min(k, 10.0) for k, _ in pairs]
    means = [s / k for k, s in pairs]
    mean = sum(w * m for w, m in zip(weights, means, strict=True)) / sum(weights)
    spread = sum(w * w * (m - mean) ** 2 for w, m in zip(weights, means, strict=True))
    by_hand = len(pairs) / (len(pairs) - 1) * spread / sum(weights) ** 2
    assert per_user(UserStats.of(pairs)) == pytest.approx((mean, by_hand))
    grown = UserStats.of([*pairs[:-1], (1.0, 0.5)])  # the last user's sums grow from (1, 0.5) to its pair
    grown.move((1.0, 0.5), pairs[-1])
    assert grown.values() == pytest.approx(UserStats.of(pairs).values())
    assert per_user(UserStats.of([(5.0, 1.0)]))[1] == math.inf  # one user: no variance, the rule waits
    live = UserStats.of([(10.0, 2.5)] * 40)
    assert judge(UserStats.of([(500.0, 100.0)]), live, min_events=100).action == "wait"
    spread = UserStats.of([(10.0, 2.0 + (u % 3) * 0.5) for u in range(40)])  # 0.25 a list
    few = UserStats.of([(125.0, 0.0)] * 4)  # far worse, but four users: nothing decided on them
    assert judge(few, spread, min_events=100).action == "wait"
    five = UserStats.of([(100.0, 0.0)] * 4 + [(100.0, 1.0)])  # five: proof enough to retire
    assert judge(five, spread, min_events=100).action == "retire"
    level = UserStats.of([(100.0, 25.0 + u) for u in range(5)])
    assert judge(level, spread, min_events=100).action == "promote"


def test_lists_no_arrival_can_score_any_more_go_when_the_next_comes() -> None:
    """Every arrival before `settled_before` has been scored: of the lists older than that, only the newest
    of a model and variant can still be scored (by a later arrival), so the older ones go at once."""
    lists = ServedLists(window_s=100, max_lists=100)
    lists.record("ns", "u", served("a", 1))
    lists.record("ns", "u", served("b", 2))
    lists.record("ns", "u", served("s", 2, variant="shadow"))
    lists.settled_before = 5
    lists.record("ns", "u", served("c", 6))
    assert lists.size == 3 and lists.take().superseded == 1  # "a" went; "b" may still meet an arrival at 5.5
    got = lists.score([Arrival("ns", "u", "b", 5.5)])
    assert sorted((s.items, sc.hits) for s, sc, _ in got) == [(("b",), 1), (("s",), 0)]
    assert [s.items for s, _, _ in lists.score([Arrival("ns", "u", "c", 7)])] == [("c",)]


def test_lists_shown_are_kept_for_exposure_a_shadow_s_never() -> None:
    lists = ServedLists(window_s=100, max_lists=2)
    lists.record("ns", "u", served("a b", 1))
    lists.record("ns", "w", served("c", 1, variant="shadow"))  # never shown to anyone
    lists.record("ns", "v", served("a d", 2))
    lists.record("ns", "x", served("e", 3))  # past max_lists since the last take: not counted
    shown = lists.take().shown
    assert [s[3] for s in shown] == [("a", "b"), ("a", "d")]
    got = exposure_of(shown, {("m", "v1"): frozenset({"a"})})
    assert got == {("m", "v1", "live"): Exposure(lists=2, slots=4, head=2, items={"a", "b", "d"})}
    assert exposure_of(shown, {})[("m", "v1", "live")].head == 0  # a version no longer loaded: no head known


def test_a_scored_list_is_summed_under_the_segment_it_is_given() -> None:
    lists = ServedLists(window_s=100, max_lists=100)
    lists.record("ns", "u", served("a b", 10))
    lists.record("ns", "w", served("c", 10))
    got = lists.score([Arrival("ns", "u", "a", 20), Arrival("ns", "w", "c", 20)], segment=lambda s, user: user)
    assert [seg for _, _, seg in got] == ["u", "w"]
    assert set(lists.take().sums) == {("m", "v1", "live", 0.0, "u"), ("m", "v1", "live", 0.0, "w")}
