"""Recent activity counts: strictly earlier events only, per window and direction, unknown users left out."""

from pathlib import Path

import numpy as np
import pytest

from models import activity
from models.activity import Activity, EventLog, merge, recent_activity, stack
from models.history_table import HistoryTableError


def _counts(a: Activity) -> dict[tuple[int, int], list[float]]:
    return {(int(r), int(u)): c.tolist() for r, u, c in zip(a.rows, a.users, a.counts, strict=True)}


def test_counts_per_window_and_direction_strictly_before_the_query() -> None:
    times = np.array([0.0, 10.0, 20.0, 30.0, 100.0])
    made, received = np.array([2, 3, 2, 4, 5]), np.array([3, 2, 3, 1, 2])
    a = recent_activity(times, made=made, received=received, query_times=np.array([30.0, 1000.0]), windows=[15, 100])
    # At 30: the events at 0, 10 and 20 (not the one at 30); in the last 15 s only the one at 20.
    assert _counts(a) == {(0, 2): [0.0, 1.0, 1.0, 2.0], (0, 3): [1.0, 2.0, 0.0, 1.0]}
    # User 1 (UNK: unknown to the model) is never counted; nothing in the 100 s before 1000.
    assert 1 not in a.users.tolist()
    assert len(a.row(1).users) == 0 and _counts(a.row(0)) == _counts(a)
    # Windows in another order: the same counts, columns in that order.
    b = recent_activity(times, made=made, received=received, query_times=np.array([30.0, 1000.0]), windows=[100, 15])
    assert _counts(b) == {k: [c[1], c[0], c[3], c[2]] for k, c in _counts(a).items()}


def test_contacts_and_actions_add_their_own_counts() -> None:
    times = np.array([1.0, 2.0, 3.0])
    made, received, actions = np.array([2, 5, 6]), np.array([3, 2, 5]), np.array([2, 3, 3])
    a = recent_activity(
        times,
        made=made,
        received=received,
        query_times=np.array([10.0]),
        windows=[100],
        contacts=np.array([[0, 5]]),  # the querying user's newest steps went to user 5
        actions=actions,
        n_actions=2,
    )
    # Columns: received, made, with a contact, received per action (2), made per action (2).
    assert _counts(a) == {
        (0, 2): [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0],  # made 2->3 (action 2); received 5->2 (action 3) from 5
        (0, 3): [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
        (0, 5): [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0],  # its own events with itself are not "with a contact"
        (0, 6): [0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0],  # 6 -> 5
    }


def test_a_busy_window_counts_its_newest_events_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(activity, "MAX_EVENTS", 3)
    times = np.arange(10.0)
    a = recent_activity(times, made=np.full(10, 2), received=np.full(10, 3), query_times=np.array([9.5]), windows=[100])
    assert _counts(a) == {(0, 2): [0.0, 3.0], (0, 3): [3.0, 0.0]}


def test_merge_and_stack_sum_disjoint_events() -> None:
    t = np.array([1.0, 2.0])
    first = recent_activity(
        t, made=np.array([2, 2]), received=np.array([3, 4]), query_times=np.array([5.0]), windows=[10]
    )
    second = recent_activity(
        np.array([3.0]), made=np.array([3]), received=np.array([2]), query_times=np.array([5.0]), windows=[10]
    )
    both = recent_activity(
        np.array([1.0, 2.0, 3.0]),
        made=np.array([2, 2, 3]),
        received=np.array([3, 4, 2]),
        query_times=np.array([5.0]),
        windows=[10],
    )
    assert _counts(merge(first, second)) == _counts(both)
    s = stack([both.row(0), Activity.empty(2), both.row(0)], 2)
    assert sorted({r for r, _ in _counts(s)}) == [0, 2]


def test_event_log_round_trips_in_time_order_and_refuses_a_bad_one(tmp_path: Path) -> None:
    EventLog(
        np.array([5.0, 1.0, 3.0]), made=np.array([2, 3, 4]), received=np.array([4, 2, 3]), actions=np.array([2, 2, 3])
    ).write(tmp_path / "ev")
    log = EventLog.read(tmp_path / "ev")
    assert log.times.tolist() == [1.0, 3.0, 5.0] and log.made.tolist() == [3, 4, 2]
    np.save(tmp_path / "ev" / "times.npy", np.array([5.0, 1.0, 3.0]))
    with pytest.raises(HistoryTableError, match="time order"):
        EventLog.read(tmp_path / "ev")
    np.save(tmp_path / "ev" / "made.npy", np.array([1, 2], dtype=np.int32))
    with pytest.raises(HistoryTableError, match="length"):
        EventLog.read(tmp_path / "ev")
