"""Team-Draft interleaving and its credit, the sign test and the interleaved rule, against hand computations."""

from __future__ import annotations

import random

import pytest

from app.production.interleave import BOTH, CANDIDATE, LIVE, credit, seed_of, team_draft
from app.production.promotion import judge_interleaved
from app.production.sequential import signs
from app.store import UserStats


def _coins(seed: int, n: int) -> list[int]:
    coin = random.Random(seed)
    return [coin.randrange(2) for _ in range(n)]


def _seed_whose_first_coins_are(wanted: list[int]) -> int:
    return next(s for s in range(1000) if _coins(s, len(wanted)) == wanted)


def test_the_side_with_fewer_picks_goes_next_and_a_coin_breaks_each_tie() -> None:
    live, cand = ["a", "b", "c", "d"], ["x", "y", "z", "w"]
    # Coins at the ties (before picks 1, 3, 5): live first, then the candidate, then live.
    seed = _seed_whose_first_coins_are([0, 1, 0])
    picks, teams = team_draft(live, cand, 6, seed=seed)
    # Tie -> live picks a; candidate has fewer -> x; tie -> candidate y; live has fewer -> b; tie -> live c; then z.
    assert picks == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2)]
    assert teams == "LCCLLC"


def test_an_item_both_lists_hold_is_drafted_once_and_credits_neither() -> None:
    live, cand = ["a", "b", "c"], ["b", "a", "d"]
    seed = _seed_whose_first_coins_are([1, 0])
    picks, teams = team_draft(live, cand, 3, seed=seed)
    # Tie -> the candidate picks b (live holds it too); live has fewer -> its best not taken: a (both hold it);
    # tie -> live again: c (only live holds it).
    assert picks == [(1, 0), (0, 0), (0, 2)]
    assert teams == BOTH + BOTH + LIVE
    items = ["b", "a", "c"]
    assert credit(items, teams, "b") == 0 and credit(items, teams, "a") == 0  # both lists held it
    assert credit(items, teams, "c") == -1  # only the live list held it
    assert credit(items, teams, "zzz") == 0  # not shown: no credit


def test_a_candidate_only_item_credits_the_candidate_and_lists_run_out_cleanly() -> None:
    live, cand = ["a"], ["a", "x", "y"]
    picks, teams = team_draft(live, cand, 5, seed=3)
    # Whoever wins the first tie takes a (both hold it); live has nothing left, so the candidate fills the rest.
    assert [(live, cand)[s][i] for s, i in picks] == ["a", "x", "y"]
    assert teams == BOTH + CANDIDATE + CANDIDATE
    assert credit(["a", "x", "y"], teams, "y") == 1


def test_the_same_request_gives_the_same_answer_and_requests_differ() -> None:
    live, cand = [f"l{n}" for n in range(10)], [f"c{n}" for n in range(10)]
    one = team_draft(live, cand, 10, seed=seed_of("m", "u1", "rid-1"))
    assert one == team_draft(live, cand, 10, seed=seed_of("m", "u1", "rid-1"))
    others = {team_draft(live, cand, 10, seed=seed_of("m", "u1", f"rid-{n}"))[1] for n in range(20)}
    assert len(others) > 1
    for _, teams in [one, *((None, t) for t in others)]:  # the teams stay within one pick of each other
        assert all(abs(teams[:n].count("L") - teams[:n].count("C")) <= 1 for n in range(0, 11, 2))


def _side(credits: list[float]) -> UserStats:
    return UserStats.of([(3.0, c) for c in credits])


def test_the_interleaved_rule_waits_promotes_and_retires() -> None:
    """Retired as soon as the users favouring the live version outnumber the others beyond chance (an anytime
    sign test: no minimum of users); promoted once min_events answers and MIN_USERS users favouring a side
    came without that."""
    assert judge_interleaved(_side([-1.0] * 4), min_events=10).action == "wait"  # 4 users: nothing to say yet
    assert judge_interleaved(_side([1.0] * 40), min_events=1000).action == "wait"  # 120 answers < 1000
    even = judge_interleaved(_side([1.0] * 20 + [-1.0] * 20 + [0.0] * 10), min_events=10)
    assert even.action == "promote" and even.figures["favour_neither"] == 10
    worse = judge_interleaved(_side([1.0] * 8 + [-2.0] * 32), min_events=10)
    assert worse.action == "retire" and worse.figures["e_value"] == pytest.approx(signs(8, 32).e_value)
    assert judge_interleaved(_side([1.0] * 10 + [-2.0] * 30), min_events=10).action == "promote"  # e-value 23
    few_heavy = judge_interleaved(_side([-1.0] * 10), min_events=10**6)  # ten heavy users, all one way
    assert few_heavy.action == "retire", few_heavy
    better = judge_interleaved(_side([2.0] * 30 + [-1.0] * 10), min_events=10)
    assert better.action == "promote"


def test_user_stats_count_signs_as_a_user_s_credits_move() -> None:
    stats = UserStats()
    stats.move(None, (1.0, 1.0))
    stats.move(None, (1.0, -1.0))
    stats.move((1.0, 1.0), (2.0, 0.0))  # the first user's second event credited the live version: a tie
    assert (stats.users, stats.positive, stats.negative) == (2, 0, 1)
    stats.move((1.0, -1.0), (2.0, 1.0))  # -1 -> +1 (a +2 step cannot happen, but the counts follow any move)
    assert (stats.positive, stats.negative) == (1, 0)
