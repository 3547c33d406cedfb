"""The production state interface, the same on both backends: pins, the arrivals log, online sums,
candidates settled once, a trial's running sums."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import pytest

from app.store import (
    EXPOSURE_BUCKET_S,
    Candidate,
    Event,
    Exposure,
    HistoryStore,
    ProductionState,
    RedisStore,
    RetrainRecord,
    SQLiteStore,
    Sums,
    Traffic,
    UserStats,
)
from app.store.state import ARRIVALS_KEEP_S, TrialEnd
from tests.servers import wait_until


def test_version_pins_are_kept_and_removed(state: ProductionState) -> None:
    assert state.pins() == {}
    state.set_pin("sasrec", "20261122T111403Z")
    state.set_pin("bert", "20261122T111403Z-2")
    state.set_pin("sasrec", "20261120T000000Z")  # a new pin replaces the old
    assert state.pins() == {"sasrec": "20261120T000000Z", "bert": "20261122T111403Z-2"}
    state.set_pin("bert", None)
    state.set_pin("never-pinned", None)
    assert state.pins() == {"sasrec": "20261120T000000Z"}


def test_arrivals_come_in_store_order_from_a_cursor(histories: HistoryStore, state: ProductionState) -> None:
    """What the histories take, the arrivals log gives back: one backend, one write."""
    histories.append("ml", [Event("old", "u0", "a", 1.0)])
    cursor, nothing = state.arrivals(None)  # a worker starts reading from now
    assert nothing == []
    histories.append("ml", [Event("e1", "u1", "x", 30.0), Event("e2", "u2", "y", 10.0)])
    histories.append("ml", [Event("e1", "u1", "x", 30.0)])  # a duplicate arrives nowhere
    histories.append("beauty", [Event("m", "u1", "z", math.nan), Event("<-m", "u9", "u1", math.nan, received=True)])
    cursor, got = state.arrivals(cursor, limit=2)
    assert [(a.namespace, a.user, a.item) for a in got] == [("ml", "u1", "x"), ("ml", "u2", "y")]
    cursor, got = state.arrivals(cursor)
    assert [(a.namespace, a.user, a.item) for a in got] == [("beauty", "u1", "z")]  # received steps are not arrivals
    assert state.arrivals(cursor) == (cursor, [])
    # The answer an event names travels with its arrival (online evaluation's attribution).
    histories.append("ml", [Event("e3", "u1", "w", 40.0, recommendation_id="r-1"), Event("e4", "u3", "v", 41.0)])
    _, got = state.arrivals(cursor)
    assert [(a.user, a.recommendation_id) for a in got] == [("u1", "r-1"), ("u3", None)]


def test_a_sqlite_file_of_the_previous_schema_keeps_its_figures_and_gains_sign_counts(tmp_path: Path) -> None:
    import sqlite3

    p = tmp_path / "v8.sqlite3"
    with sqlite3.connect(p) as conn:  # the production tables as version 8 wrote them
        conn.executescript("""
        CREATE TABLE arrivals (seq INTEGER PRIMARY KEY AUTOINCREMENT, ns TEXT NOT NULL, user TEXT NOT NULL,
            item TEXT NOT NULL, at REAL NOT NULL);
        CREATE TABLE online (name TEXT NOT NULL, version TEXT NOT NULL, variant TEXT NOT NULL, bucket REAL NOT NULL,
            n REAL NOT NULL, hits REAL NOT NULL, ndcg REAL NOT NULL, ndcg2 REAL NOT NULL, rr REAL NOT NULL,
            PRIMARY KEY (name, version, variant, bucket)) WITHOUT ROWID;
        CREATE TABLE trial_users (name TEXT NOT NULL, trial REAL NOT NULL, version TEXT NOT NULL, variant TEXT NOT NULL,
            user TEXT NOT NULL, n REAL NOT NULL, ndcg REAL NOT NULL, PRIMARY KEY (name, trial, version, variant, user))
            WITHOUT ROWID;
        CREATE TABLE trial_stats (name TEXT NOT NULL, trial REAL NOT NULL, version TEXT NOT NULL,
            variant TEXT NOT NULL, users REAL NOT NULL, n REAL NOT NULL, s REAL NOT NULL, nn REAL NOT NULL,
            ss REAL NOT NULL, ns REAL NOT NULL, PRIMARY KEY (name, trial, version, variant)) WITHOUT ROWID;
        INSERT INTO arrivals (ns, user, item, at) VALUES ('ml', 'u1', 'x', 1.0);
        INSERT INTO online VALUES ('m', 'v1', 'live', 60.0, 2, 1, 0.5, 0.25, 0.5);
        INSERT INTO trial_users VALUES ('m', 5.0, 'v2', 'canary', 'a', 2, 0.5), ('m', 5.0, 'v2', 'canary', 'b', 1, 0);
        PRAGMA user_version = 8;
        """)
    s = SQLiteStore(p)
    assert [(a.user, a.recommendation_id) for a in s.arrivals("0")[1]] == [("u1", None)]
    assert s.online("m")[("m", "v1", "live", 60.0, "")].values() == pytest.approx((2, 1, 0.5, 0.25, 0.5, 0))
    assert s.trial_stats("m", 5.0)[("v2", "canary")] == UserStats.of([(2.0, 0.5), (1.0, 0.0)])
    assert s.trial_stats("m", 5.0)[("v2", "canary")].positive == 1
    assert s.retrain_record("m") == RetrainRecord()  # the retrainer's table, new since
    s.close()


def test_online_sums_add_up_across_writers(state: ProductionState) -> None:
    key = ("sasrec", "v1", "live", 1_800_000_000.0, "known")
    state.add_online({key: Sums(1, 1, 0.5, 0.25, 0.5, 1)})
    state.add_online(
        {key: Sums(1, 0, 0, 0, 0.1), ("sasrec", "v2", "canary", 1_800_000_000.0, "new+fresh"): Sums(1, 1, 1, 1, 1)}
    )
    state.add_online({("other", "v1", "live", 1_800_000_000.0, "known"): Sums(5, 5, 5, 5, 5)})
    got = state.online("sasrec")
    assert got[key].values() == pytest.approx((2, 1, 0.5, 0.25, 0.6, 1))
    assert set(got) == {key, ("sasrec", "v2", "canary", 1_800_000_000.0, "new+fresh")}


def test_exposure_adds_up_across_writers_and_its_items_are_one_set(state: ProductionState) -> None:
    now = math.floor(time.time() / EXPOSURE_BUCKET_S) * EXPOSURE_BUCKET_S
    before = now - 3 * EXPOSURE_BUCKET_S
    state.add_exposure({("sasrec", "v1", "live", now): Exposure(2, 20, 5, {"a", "b"})})
    state.add_exposure(
        {
            ("sasrec", "v1", "live", now): Exposure(1, 10, 1, {"b", "c|d"}),  # another worker, the same bucket
            ("sasrec", "v1", "live", before): Exposure(4, 40, 40, {"old"}),
            ("sasrec", "v2", "canary", now): Exposure(1, 10, 0, {"a"}),
            ("other", "v1", "live", now): Exposure(9, 90, 9, {"z"}),
        }
    )
    got = state.exposure("sasrec", since=now - EXPOSURE_BUCKET_S / 2)  # the bucket before ends after it: in
    assert set(got) == {("v1", "live"), ("v2", "canary")}
    assert got[("v1", "live")] == Exposure(3, 30, 6, {"a", "b", "c|d"})
    assert got[("v2", "canary")] == Exposure(1, 10, 0, {"a"})
    assert state.exposure("sasrec", since=before)[("v1", "live")] == Exposure(7, 70, 46, {"a", "b", "c|d", "old"})
    assert state.exposure("nothing", since=before) == {}


def test_online_sums_written_before_segments_read_as_segment_none(state: ProductionState) -> None:
    b = math.floor(time.time() / 60) * 60
    if isinstance(state, RedisStore):  # fields of the earlier layout: version|variant|bucket|metric
        state.r.hset(state._of_model("m", "online"), mapping={f"v1|live|{b}|n": 2, f"v1|live|{b}|ndcg": 0.5})
    else:
        assert isinstance(state, SQLiteStore)
        state._write(
            lambda c: c.execute("INSERT INTO online VALUES ('m', 'v1', 'live', ?, '', 2, 0, 0.5, 0, 0, 0)", (b,))
        )
    state.add_online({("m", "v1", "live", float(b), "known"): Sums(1, 1, 1, 1, 1)})
    got = state.online("m")
    assert (got[("m", "v1", "live", float(b), "")].n, got[("m", "v1", "live", float(b), "")].ndcg) == (2, 0.5)
    assert got[("m", "v1", "live", float(b), "known")].n == 1


def test_a_candidate_is_settled_once(state: ProductionState) -> None:
    c = Candidate("v2", "canary", 0.25, 100.0)
    state.set_candidate("sasrec", c)
    assert state.candidates() == {"sasrec": c}
    assert not state.settle("sasrec", "v3", promote=True)  # not the candidate: nothing written
    assert state.candidates() == {"sasrec": c} and state.pins() == {}
    state.set_pin("sasrec", "v1")  # the live version, pinned while the trial runs
    before = time.time()
    assert state.settle("sasrec", "v2", promote=True)
    promoted = state.candidates()["sasrec"]
    assert promoted.ended is not None and before <= promoted.ended <= time.time()
    assert promoted == Candidate("v2", "canary", 0.25, 100.0, TrialEnd("promoted", promoted.ended, "v1"))
    assert state.pins() == {"sasrec": "v2"}
    assert not state.settle("sasrec", "v2", promote=False)  # a second worker's late decision changes nothing
    assert state.candidates()["sasrec"].outcome == "promoted"
    state.set_candidate("sasrec", Candidate("v4", "shadow", 1.0, 200.0))
    assert state.settle("sasrec", "v4", promote=False)  # retired: the pin stays, the trial is remembered
    retired = state.candidates()["sasrec"]
    assert (retired.outcome, retired.replaced) == ("retired", None) and state.pins() == {"sasrec": "v2"}
    state.set_candidate("sasrec", None)
    assert state.candidates() == {}


def test_a_trials_user_sums_add_up_and_go_with_the_next_trial(state: ProductionState) -> None:
    state.set_candidate("m", Candidate("v2", "canary", 0.5, 100.0))
    state.add_user_sums({("m", 100.0, "v2", "canary", "u1"): (1, 0.5), ("m", 100.0, "v1", "live", "u2"): (2, 1.0)})
    state.add_user_sums({("m", 100.0, "v2", "canary", "u1"): (1, 0.25), ("other", 100.0, "v1", "live", "u2"): (9, 9)})
    assert state.trial_stats("m", 100.0) == {
        ("v2", "canary"): UserStats.of([(2.0, 0.75)]),
        ("v1", "live"): UserStats.of([(2.0, 1.0)]),
    }
    state.set_candidate("m", Candidate("v3", "canary", 0.5, 200.0))  # a new trial: the old one's sums go
    assert state.trial_stats("m", 100.0) == {} and state.trial_stats("other", 100.0) != {}


def test_a_trials_running_sums_equal_its_users_whatever_order_they_came_in(state: ProductionState) -> None:
    import random

    rng = random.Random(3)
    users: dict[tuple[str, str], dict[str, list[float]]] = {}
    for _ in range(6):  # several ticks, each adding to some users of every side, new and known
        tick = {}
        for _ in range(60):
            side = rng.choice([("v1", "live"), ("v2", "canary"), ("v2", "interleave")])
            user, k, s = f"u{rng.randrange(25)}", float(rng.randrange(1, 4)), rng.random()
            if side[1] == "interleave":  # credits: a user's sum crosses zero both ways (the sign counts)
                s = float(rng.choice([-1, 0, 1]))
            got = users.setdefault(side, {}).setdefault(user, [0.0, 0.0])
            got[0] += k
            got[1] += s
            key = ("m", 7.0, *side, user)
            tick[key] = [a + b for a, b in zip(tick.get(key, [0.0, 0.0]), (k, s), strict=True)]
        state.add_user_sums(tick)
    stats = state.trial_stats("m", 7.0)
    for side, per_user in users.items():
        expected = UserStats.of([(k, s) for k, s in per_user.values()])
        assert (stats[side].users, stats[side].positive, stats[side].negative) == (
            expected.users,
            expected.positive,
            expected.negative,
        )
        assert stats[side].values() == pytest.approx(expected.values())
    assert stats[("v2", "interleave")].positive > 0 and stats[("v2", "interleave")].negative > 0


def test_sqlite_arrivals_past_their_keep_are_dropped_on_expire(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "h.sqlite3")
    s.append("ml", [Event("e1", "u1", "x", 1.0), Event("e2", "u2", "y", 2.0)])
    cursor, _ = s.arrivals(None)
    s.expire(now=time.time())  # nothing is old yet
    assert len(s.arrivals("0")[1]) == 2
    s.expire(now=time.time() + ARRIVALS_KEEP_S + 1)  # no event arrives, the housekeeping tick trims
    assert s.arrivals("0")[1] == [] and s.arrivals(cursor) == (cursor, [])
    s.close()


def test_a_redis_trial_from_before_the_running_sums_gets_them_from_its_users(redis_server: object) -> None:
    s = RedisStore(redis_server.url, prefix="old-trial:")  # type: ignore[attr-defined]
    key = "old-trial:trial:m:5.0"  # the per-user hash as the previous version wrote it, no sides' sums
    s.r.hset(key, mapping={json.dumps(["v1", "live", "a", "n"]): 2, json.dumps(["v1", "live", "a", "ndcg"]): 0.5})
    s.add_user_sums({("m", 5.0, "v1", "live", "b"): (1, 0.25), ("m", 5.0, "v1", "live", "a"): (1, 0.5)})
    assert s.trial_stats("m", 5.0)[("v1", "live")].values() == pytest.approx(
        UserStats.of([(3.0, 1.0), (1.0, 0.25)]).values()
    )
    s.close()


def test_a_lease_is_held_renewed_and_taken_over_once_past_its_time(state: ProductionState) -> None:
    """The retrainer's lease: one holder at a time; a holder that stops renewing (a dead process) loses it
    at its time, and giving it up frees it at once."""
    assert state.take_lease("retrainer", "a", ttl_s=60, now=1000.0)
    assert not state.take_lease("retrainer", "b", ttl_s=60, now=1059.9)  # a's is current
    assert state.take_lease("retrainer", "a", ttl_s=60, now=1050.0)  # renewed: until 1110
    assert not state.take_lease("retrainer", "b", ttl_s=60, now=1100.0)
    assert state.take_lease("other-lease", "b", ttl_s=60, now=1100.0)  # leases are apart by name
    assert state.take_lease("retrainer", "b", ttl_s=60, now=1110.0)  # a stopped renewing: taken over
    assert not state.take_lease("retrainer", "a", ttl_s=60, now=1111.0)
    state.drop_lease("retrainer", "a")  # not a's any more: nothing happens
    assert not state.take_lease("retrainer", "a", ttl_s=60, now=1112.0)
    state.drop_lease("retrainer", "b")
    assert state.take_lease("retrainer", "a", ttl_s=60, now=1113.0)


def test_a_promotion_is_rolled_back_once_to_the_version_it_replaced(state: ProductionState) -> None:
    state.set_pin("sasrec", "v1")
    state.set_candidate("sasrec", Candidate("v2", "canary", 0.5, 100.0))
    assert not state.roll_back("sasrec", "v2")  # still on trial: nothing to undo
    assert state.settle("sasrec", "v2", promote=True)
    assert not state.roll_back("sasrec", "v9") and not state.roll_back("other", "v2")
    assert state.pins() == {"sasrec": "v2"}
    assert state.roll_back("sasrec", "v2")
    assert state.pins() == {"sasrec": "v1"} and state.candidates()["sasrec"].outcome == "rolled_back"
    assert not state.roll_back("sasrec", "v2")  # a second worker's late decision changes nothing
    state.set_candidate("sasrec", Candidate("v3", "canary", 0.5, 200.0))
    assert state.settle("sasrec", "v3", promote=False)
    assert not state.roll_back("sasrec", "v3")  # retired, not promoted


def test_probation_ends_once_confirmed_or_rolled_back(state: ProductionState) -> None:
    """Confirming a promotion ends its probation: nothing rolls it back by itself after, and a second worker's
    late decision either way changes nothing."""
    state.set_pin("sasrec", "v1")
    state.set_candidate("sasrec", Candidate("v2", "canary", 0.5, 100.0))
    assert not state.confirm("sasrec", "v2")  # still on trial
    assert state.settle("sasrec", "v2", promote=True)
    assert state.candidates()["sasrec"].on_probation
    assert not state.confirm("sasrec", "v9") and not state.confirm("other", "v2")
    assert state.confirm("sasrec", "v2")
    got = state.candidates()["sasrec"]
    assert (got.outcome, got.on_probation, got.replaced) == ("promoted", False, "v1") and got.confirmed is not None
    assert not state.confirm("sasrec", "v2") and not state.roll_back("sasrec", "v2")
    assert state.pins() == {"sasrec": "v2"}


def test_the_retrainers_record_is_kept_per_model(state: ProductionState) -> None:
    assert state.retrain_record("sasrec") == RetrainRecord()
    record = RetrainRecord(ended=1_800_000_000.5, outcome="held_back", base="v2", in_a_row=2, good="v1")
    state.set_retrain_record("sasrec", record)
    state.set_retrain_record("other", RetrainRecord(ended=1.0, outcome="published", base="x"))
    assert state.retrain_record("sasrec") == record
    state.set_retrain_record("sasrec", dataclasses.replace(record, in_a_row=0, outcome="published"))
    assert state.retrain_record("sasrec").in_a_row == 0 and state.retrain_record("other").base == "x"


def test_traffic_adds_up_across_writers_and_is_read_from_a_time_on(state: ProductionState) -> None:
    now = time.time() // 60 * 60
    one, two, old = now - 120.0, now - 60.0, now - 3 * 86_400.0  # the last: another day, before `since`
    state.add_traffic({("m", "v1", one): Traffic(2, 1, {3: 1.0, 7: 1.0}), ("m", "v1", old): Traffic(9, 9, {})})
    state.add_traffic({("m", "v1", one): Traffic(1, 0, {7: 1.0}), ("m", "v2", two): Traffic(1, 0, {0: 1.0})})
    state.add_traffic({("other", "v1", one): Traffic(5, 5, {1: 5.0})})
    got = state.traffic("m", since=now - 86_400.0)
    assert set(got) == {("m", "v1", one), ("m", "v2", two)}
    assert set(state.traffic("m", since=old)) == {("m", "v1", old), ("m", "v1", one), ("m", "v2", two)}
    assert set(state.traffic("m", since=two)) == {("m", "v2", two)}  # minutes of a day read before `since`: left out
    assert got[("m", "v1", one)] == Traffic(3, 1, {3: 1.0, 7: 2.0})


def test_a_new_trial_keeps_the_running_probation_s_per_user_sums(state: ProductionState) -> None:
    state.set_candidate("m", Candidate("v2", "canary", 0.5, 100.0))
    state.add_user_sums({("m", 100.0, "v2", "canary", "a"): (1, 0.5)})
    assert state.settle("m", "v2", promote=True)
    ended = state.candidates()["m"].ended
    assert ended is not None
    state.add_user_sums({("m", ended, "v2", "live", "b"): (2, 1.0)})  # its probation's, kept under `ended`
    state.set_candidate("m", Candidate("v3", "canary", 0.5, ended + 10))
    assert state.trial_stats("m", ended)[("v2", "live")] == UserStats.of([(2.0, 1.0)])
    assert state.trial_stats("m", 100.0) == {}  # the trial that ended is dropped
    state.set_candidate("m", Candidate("v4", "canary", 0.5, ended + 20))  # the last one was no promotion
    assert state.trial_stats("m", ended) == {}


def test_the_reloads_asked_are_one_count_every_host_reads(state: ProductionState) -> None:
    assert state.reloads() == 0
    assert [state.add_reload(), state.add_reload()] == [1, 2]
    assert state.reloads() == 2


def test_hidden_items_and_named_filters_are_kept_per_model(state: ProductionState) -> None:
    from app.store import HiddenItem

    assert state.hidden("m") == {} and state.filters("m") == {}
    assert state.hide("m", {"a": HiddenItem(None, "recalled", 1.0), "b": HiddenItem(5.0, "", 2.0)}) == 2
    assert state.hide("m", {"a": HiddenItem(9.0, "back soon", 3.0)}) == 2  # updated, not added
    assert state.hidden("m") == {"a": HiddenItem(9.0, "back soon", 3.0), "b": HiddenItem(5.0, "", 2.0)}
    assert state.hidden("other") == {}
    assert state.unhide("m", ["b", "never-hidden"]) == 1 and list(state.hidden("m")) == ["a"]
    state.set_filter("m", "recent", '{"field":"year","between":[{"param":"after"},null]}')
    state.set_filter("m", "recent", '{"field":"year","between":[1990,null]}')
    assert state.filters("m") == {"recent": '{"field":"year","between":[1990,null]}'} and state.filters("other") == {}
    state.set_filter("m", "recent", None)
    assert state.filters("m") == {}


def test_arrivals_since_a_time_are_read_from_its_first_cursor(histories: HistoryStore, state: ProductionState) -> None:
    """A worker that starts reads what was taken over the window before it (the fallback's recent takes)."""
    import time

    histories.append("ml", [Event("a1", "u1", "x", 1.0)])
    taken = time.time()
    wait_until(lambda: time.time() > taken + 0.02)  # arrivals carry the store's clock, to the millisecond
    middle = time.time()
    wait_until(lambda: time.time() > middle + 0.02)
    histories.append("ml", [Event("a2", "u2", "y", 2.0), Event("a3", "u3", "z", 3.0)])
    _, got = state.arrivals(state.first_cursor(middle))
    assert [a.item for a in got] == ["y", "z"]
    _, every = state.arrivals(state.first_cursor(0.0))
    assert [a.item for a in every] == ["x", "y", "z"]
    assert state.arrivals(state.first_cursor(time.time() + 60))[1] == []
