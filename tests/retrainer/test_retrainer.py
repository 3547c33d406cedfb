"""python -m retrainer: the triggers at their bounds, one holder of the lease at a time, a retrain that
starts by itself and enters as a candidate, and no training left behind by a killed retrainer."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from app.production.promotion import Window, online_windows
from app.store import Arrival, Candidate, SQLiteStore, Sums
from app.store.state import TrialEnd
from models.artifact import HELD, RUNS, TMP_PREFIX, versions
from retrainer.retrain import keep_held, sweep_runs
from retrainer.retrainer import (
    LEASE,
    STALE_TMP_S,
    Bounds,
    Metrics,
    Reading,
    Recent,
    Retrainer,
    fired,
    left_alone,
    unfit,
)
from retrainer.settings import RetrainerSettings
from tests.servers import ROOT, free_port, start_api, stop, wait_until

BOUNDS = Bounds(min_events=100, unknown_share=0.05, sag=True, min_lists=200, max_age_s=7 * 86400)
QUIET = Reading(
    name="m",
    version="20261101T000000Z",
    age_s=86400,
    pending=99,
    recent=1000,
    recent_unknown=49,
    before=Window(400, 0.30, 0.04),
    now=Window(400, 0.29, 0.04),
)


def test_a_quiet_model_fires_nothing() -> None:
    assert fired(QUIET, BOUNDS) == []


@pytest.mark.parametrize(
    ("trigger", "at_bound", "below"),
    [
        ("events", {"pending": 100}, {"pending": 99}),
        ("unknown", {"recent_unknown": 50}, {"recent_unknown": 49}),
        ("age", {"age_s": 7 * 86400}, {"age_s": 7 * 86400 - 1}),
        # half-width = 1.96 * sqrt(0.04/400 * 2) = 0.02772: a drop just past it fires, just under does not
        ("sag", {"now": Window(400, 0.30 - 0.0278, 0.04)}, {"now": Window(400, 0.30 - 0.0277, 0.04)}),
    ],
)
def test_each_trigger_fires_at_its_bound_and_not_below(
    trigger: str, at_bound: dict[str, object], below: dict[str, object]
) -> None:
    got = fired(dataclasses.replace(QUIET, **at_bound), BOUNDS)  # type: ignore[arg-type]
    assert [f.trigger for f in got] == [trigger], got
    assert got[0].figure >= got[0].bound
    assert fired(dataclasses.replace(QUIET, **below), BOUNDS) == []  # type: ignore[arg-type]


def test_a_trigger_set_to_zero_is_off_and_the_sag_waits_for_enough_lists() -> None:
    loud = dataclasses.replace(QUIET, pending=10**6, recent_unknown=1000, age_s=10**9, now=Window(400, 0.0, 0.0))
    off = Bounds(min_events=0, unknown_share=0, sag=False, min_lists=200, max_age_s=0)
    assert fired(loud, off) == []
    assert {f.trigger for f in fired(loud, BOUNDS)} == {"events", "unknown", "sag", "age"}
    few = dataclasses.replace(loud, now=Window(199, 0.0, 0.0))
    assert {f.trigger for f in fired(few, BOUNDS)} == {"events", "unknown", "age"}


def test_the_sag_compares_the_window_as_live_with_everything_before_it() -> None:
    def sums(n: float, mean: float) -> Sums:
        return Sums(n=n, hits=0, ndcg=n * mean, ndcg2=n * mean * mean, rr=0)

    online = {
        ("m", "v2", "canary", 100.0, "known"): sums(100, 0.4),  # its trial: part of the level it was promoted on
        ("m", "v2", "live", 200.0, "known"): sums(300, 0.2),
        ("m", "v2", "live", 400.0, "new"): sums(50, 0.1),  # in the window
        ("m", "v2", "canary", 460.0, "known"): sums(999, 0.9),  # not as the live version: not counted
        ("m", "v1", "live", 400.0, "known"): sums(999, 0.9),  # another version
    }
    before, now = online_windows(online, "v2", since=400.0)
    assert (before.n, round(before.mean, 6), now.n, now.mean) == (400, 0.25, 50, 0.1)
    assert round(before.var, 6) == round(0.25 * 0.16 + 0.75 * 0.04 - 0.25**2, 6)  # E[x^2] - E[x]^2


def test_recent_events_are_counted_per_minute_against_the_serving_version_for_one_window() -> None:
    """The unknown share's window costs a few numbers a minute whatever the traffic (the arrivals themselves are
    not kept: an hour at 10,000 events a second was gigabytes), and a new serving version starts a new count."""
    recent = Recent(window_s=60)
    known = {"a", "b"}.__contains__
    recent.add("m", "v1", [Arrival("ml", "u", "a", 100.0), Arrival("ml", "u", "x", 110.0)], known=known, now=110.0)
    recent.add("m", "v1", [Arrival("ml", "u", "b", 150.0)], known=known, now=150.0)
    assert recent.totals("m") == (3, 1)
    assert len(recent.counts["m"]) == 2  # minutes 60 and 120: two rows for three events
    recent.add("m", "v1", [], known=known, now=181.0)  # the minute from 60 s has left the window
    assert recent.totals("m") == (1, 0)
    recent.add("m", "v2", [Arrival("ml", "u", "y", 182.0)], known=known, now=182.0)
    assert recent.totals("m") == (1, 1) and recent.totals("other") == (0, 0)


def test_by_default_the_models_whose_task_retrains_warm_are_retrained_each_against_its_own_ids(
    tiny_artifacts: Path, tiny_social_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A social model retrains too: its unknown share counts targets its user map lacks (users.json); a
    next-location model has no warm retrain and is left alone."""
    from models.artifact import latest_versions

    arts = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, arts)
    shutil.copytree(tiny_social_artifact, arts, dirs_exist_ok=True)
    monkeypatch.setenv("SEQSERVE_ARTIFACTS_DIR", str(arts))
    store = SQLiteStore(tmp_path / "h.sqlite3")
    try:
        retrainer = Retrainer(RetrainerSettings(), histories=store, state=store, metrics=Metrics())
        served = [
            {"name": name, "version": "20260101T000000Z", "task": task}
            for name, task in [("sasrec-tiny", "recommend"), ("social-tiny", "social"), ("mhsa-tiny", "next_location")]
        ]
        assert [n for n, _ in retrainer.chosen(served)] == ["sasrec-tiny", "social-tiny"]
        social = latest_versions(arts)["social-tiny"].name
        now = time.time()
        arrivals = [Arrival("tinysocial", "s1", t, now) for t in ("s2", "someone-new")] + [Arrival("ml", "u", "x", now)]
        retrainer.count(arrivals, [("social-tiny", social)])
        reading = retrainer.read("social-tiny", social)
        assert (reading.recent, reading.recent_unknown) == (2, 1)
    finally:
        store.close()


def test_a_run_killed_by_the_retrainers_own_stop_is_counted_stopped_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment's shutdown (SIGTERM) kills the run in progress: the failed-retrains alert must not count it."""
    monkeypatch.setenv("SEQSERVE_ARTIFACTS_DIR", str(tmp_path))
    store = SQLiteStore(tmp_path / "h.sqlite3")
    try:
        retrainer = Retrainer(RetrainerSettings(), histories=store, state=store, metrics=Metrics(), run=lambda *_: -9)
        assert retrainer.retrain("m", "v1") == ("failed", -9)  # killed by something else: a failure

        def stopped_meanwhile(*_: str) -> int:
            retrainer.stop()
            return -9

        retrainer.run = stopped_meanwhile
        assert retrainer.retrain("m", "v1") == ("stopped", -9)
        assert retrainer.metrics.runs.labels("m", "failed")._value.get() == 1
        assert store.retrain_record("m").in_a_row == 1  # the stop does not count as a run that failed
    finally:
        store.close()


def test_the_cooldown_and_the_back_off_outlive_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each model's last run and its outcome are kept in the store beside the lease: a retrainer restarted (or
    another host's taking the lease over) waits out the cooldown; runs in a row that publish nothing double
    the wait (from at least one training budget), up to its bound, and one published run resets it."""
    monkeypatch.setenv("SEQSERVE_ARTIFACTS_DIR", str(tmp_path))
    monkeypatch.setenv("SEQSERVE_RETRAIN_COOLDOWN_S", "0")  # the replay's: back to back but for the back-off
    monkeypatch.setenv("SEQSERVE_RETRAIN_MINUTES", "0.5")
    monkeypatch.setenv("SEQSERVE_RETRAIN_BACKOFF_MAX_S", "100")
    store = SQLiteStore(tmp_path / "h.sqlite3")
    clock = Clock()
    try:
        outcomes = iter([3, 3, 3, 1, 0])
        first = Retrainer(
            RetrainerSettings(), histories=store, state=store, metrics=Metrics(), clock=clock, run=lambda *_: 0
        )
        first.run = lambda *_: next(outcomes)
        waits = []
        for _ in range(5):
            first.retrain("m", "v1")
            record = store.retrain_record("m")
            restarted = Retrainer(RetrainerSettings(), histories=store, state=store, metrics=Metrics(), clock=clock)
            left = [s for s in range(0, 200) if restarted.waits(record, now=clock.now + s) is not None]
            waits.append(len(left))
        assert waits == [30, 60, 100, 100, 0]  # held back 1, 2, 3 in a row (bounded), failed: 4; published: none
        assert store.retrain_record("m").in_a_row == 0 and store.retrain_record("m").outcome == "published"
        reason = restarted.waits(dataclasses.replace(record, in_a_row=2, outcome="held_back"), now=clock.now + 1)
        assert reason == "last retrain held_back 1 s ago; next in 59 s, backed off after 2 in a row unpublished"
    finally:
        store.close()


def test_a_model_is_left_alone_while_its_trial_runs_and_while_its_promotion_is_on_probation() -> None:
    """Probation lasts until it confirms the promotion or rolls it back, however long that takes; it is read
    from the store (the pin), since what the service says it serves lags a promotion by a tick: a replay's
    retrainer started from the replaced version in that tick."""
    now = 1_800_000_000.0
    running = Candidate("v2", "canary", 0.5, now - 60)
    assert left_alone(running, "v1", now=now) == "a trial running (v2)"
    promoted = Candidate("v2", "canary", 0.5, now - 600, TrialEnd("promoted", now - 86400, "v1"))
    assert left_alone(promoted, "v2", now=now) == "v2 on probation since its promotion 86400 s ago"
    confirmed = promoted.confirmed_at(now - 60)
    assert left_alone(confirmed, "v2", now=now) is None
    assert left_alone(promoted, "v1", now=now) is None  # pinned away since: its probation ended
    retired = Candidate("v2", "canary", 0.5, now - 600, TrialEnd("retired", now - 60))
    assert left_alone(retired, "v1", now=now) is None
    assert left_alone(None, "v1", now=now) is None


def test_a_retrain_starts_from_the_last_good_version_never_from_one_far_below_its_own_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serving version is remembered as the last good start while it is one; once it is far below its
    own offline figure online, or below its reference lists, a retrain starts from the last good version, and
    with none known it is not run (counted)."""
    monkeypatch.setenv("SEQSERVE_ARTIFACTS_DIR", str(tmp_path))
    (tmp_path / "m" / "v1").mkdir(parents=True)
    store = SQLiteStore(tmp_path / "h.sqlite3")
    try:
        retrainer = Retrainer(RetrainerSettings(), histories=store, state=store, metrics=Metrics())
        good = dataclasses.replace(QUIET, name="m", version="v1", offline=0.25, now=Window(400, 0.20, 0.04))
        assert retrainer.base(good, store.retrain_record("m"), asked=False) == "v1"
        assert store.retrain_record("m").good == "v1"
        broken = dataclasses.replace(good, version="v2", now=Window(400, 0.001, 0.0004))  # 0.004x its offline
        assert unfit(broken, min_lists=200) is not None
        assert retrainer.base(broken, store.retrain_record("m"), asked=True) == "v1"
        below_floor = dataclasses.replace(good, version="v2", floor=Window(400, 0.30, 0.04))
        assert "below its reference lists'" in str(unfit(below_floor, min_lists=200))
        assert unfit(dataclasses.replace(below_floor, floor=Window(199, 0.30, 0.04)), min_lists=200) is None
        shutil.rmtree(tmp_path / "m" / "v1")  # the last good one pruned: nothing to start from
        assert retrainer.base(broken, store.retrain_record("m"), asked=True) is None
    finally:
        store.close()


def test_the_age_trigger_reads_the_manifests_time_not_the_folders_name(tiny_artifacts: Path, tmp_path: Path) -> None:
    """A copy named 2000 (as the loop's replay names its shuffled version) is as old as its manifest says."""
    from models.artifact import latest_versions

    arts = tmp_path / "arts"
    shutil.copytree(latest_versions(tiny_artifacts)["sasrec-tiny"], arts / "sasrec-tiny" / "20000101T000002Z")
    store = SQLiteStore(tmp_path / "h.sqlite3")
    try:
        settings = RetrainerSettings(artifacts_dir=arts, history_path=tmp_path / "h.sqlite3")
        reading = Retrainer(settings, histories=store, state=store, metrics=Metrics()).read(
            "sasrec-tiny", "20000101T000002Z"
        )
        assert reading.age_s is not None and 0 <= reading.age_s < 86400
        assert reading.offline is not None and reading.offline > 0  # its offline test NDCG@10, for `unfit`
        assert fired(dataclasses.replace(QUIET, age_s=None), BOUNDS) == []  # a manifest without a time: no age
    finally:
        store.close()


def test_an_interrupted_run_leaves_nothing_behind(tmp_path: Path) -> None:
    """A run's files (its exported log, its job's output and temporary version) lie in its own folder, locked
    while it lives: killed outright (kill -9, an OOM kill, compose's stop), the lock goes with it and the
    retrainer removes the folder; a live run's folder is never touched."""
    arts = tmp_path / "arts"
    code = (
        "import sys, time; from pathlib import Path; from retrainer.retrain import run_folder; "
        "run = run_folder(Path(sys.argv[1])); f = run.__enter__(); (f / 'ml-100k.csv').write_text('x' * 100000); "
        "(f / 'out' / 'm' / '.tmp-abc').mkdir(parents=True); print('ready', flush=True); time.sleep(60)"
    )
    dead, alive = arts / RUNS / "dead-run", arts / RUNS / "live-run"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(f)], cwd=ROOT, stdout=subprocess.PIPE) for f in (dead, alive)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        procs[0].kill()
        procs[0].wait()
        assert (dead / "ml-100k.csv").exists()  # what the killed run left
        assert sweep_runs(arts) == ["dead-run"]
        assert not dead.exists() and (alive / "ml-100k.csv").exists()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert sweep_runs(arts) == ["live-run"]  # gone with its process


def test_held_back_versions_are_kept_for_a_look_but_only_the_newest(tmp_path: Path) -> None:
    arts, out = tmp_path / "arts", tmp_path / "run" / "out"
    for n in range(5):
        (out / HELD / "m" / f"2026010{n + 1}T000000Z").mkdir(parents=True)
        held = keep_held(out, arts, "m")
        assert held is not None and held.parent == arts / HELD / "m"
    assert sorted(p.name for p in (arts / HELD / "m").iterdir()) == [f"2026010{n}T000000Z" for n in (3, 4, 5)]
    assert keep_held(tmp_path / "empty", arts, "m") is None


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.mark.slow
def test_the_retrainer_retrains_when_events_pile_up_and_the_service_tries_the_result(
    tiny_artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arts = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, arts)
    stale = arts / "sasrec-tiny" / f"{TMP_PREFIX}dead-run"
    stale.mkdir()
    os.utime(stale, (time.time() - STALE_TMP_S - 60,) * 2)
    fresh = arts / "sasrec-tiny" / f"{TMP_PREFIX}writing-now"  # another job's, being published: kept
    fresh.mkdir()
    env = {
        "SEQSERVE_ARTIFACTS_DIR": str(arts),
        "SEQSERVE_HISTORY_PATH": str(tmp_path / "h.sqlite3"),
        "SEQSERVE_ADMIN_API_KEY": "admin-key",
        "SEQSERVE_NEW_VERSIONS": "canary",
        "SEQSERVE_CANARY_SHARE": "0.5",
    }
    proc, url = start_api(arts, env)
    store = SQLiteStore(tmp_path / "h.sqlite3")
    clock = Clock()
    retrainer_env = {
        "SEQSERVE_API_URL": url,
        "SEQSERVE_RETRAIN_MODELS": "sasrec-tiny",
        "SEQSERVE_RETRAIN_MIN_EVENTS": "3",
        "SEQSERVE_RETRAIN_MINUTES": "0.05",
        "SEQSERVE_RETRAIN_LEASE_S": "60",
    }
    for key, value in {**env, **retrainer_env}.items():  # what its retrain's own process reads too
        monkeypatch.setenv(key, value)
    settings = RetrainerSettings()
    metrics = Metrics()
    first = Retrainer(settings, histories=store, state=store, metrics=metrics, clock=clock)
    other = Retrainer(settings, histories=store, state=store, metrics=Metrics(), clock=clock)
    other.holder = "another-host:1"
    try:
        before, t0 = {v.name for v in versions(arts / "sasrec-tiny")}, time.time() - 100
        events = [{"event_id": f"e{n}", "user_id": "u1", "item_id": str(n + 2), "timestamp": t0 + n} for n in range(2)]
        assert httpx.post(f"{url}/events", json={"model": "sasrec-tiny", "events": events}).json()["stored"] == 2
        assert first.check() == []  # 2 new events: under the bound
        assert not stale.exists() and fresh.exists()  # taking the lease cleared what a dead run left
        assert other.check() == []  # the lease is held: the other retrainer waits
        event = {"event_id": "e9", "user_id": "u2", "item_id": "brand-new", "timestamp": t0}
        assert httpx.post(f"{url}/events", json={"model": "sasrec-tiny", "events": [event]}).json()["stored"] == 1
        assert first.check() == ["sasrec-tiny"]
        (new,) = {v.name for v in versions(arts / "sasrec-tiny")} - before
        cand = store.candidates()["sasrec-tiny"]
        assert (cand.version, cand.mode, cand.running) == (new, "canary", True)  # the service's rule decides
        sample = metrics.registry.get_sample_value
        assert sample("seqserve_retrainer_triggers_total", {"model": "sasrec-tiny", "trigger": "events"}) == 1
        # the one event stored since the first check names an item the version does not know: 1 of 1
        assert sample("seqserve_retrainer_triggers_total", {"model": "sasrec-tiny", "trigger": "unknown"}) == 1
        assert sample("seqserve_retrainer_runs_total", {"model": "sasrec-tiny", "outcome": "published"}) == 1
        clock.now += settings.retrain_cooldown_s + 1
        assert first.check() == []  # its trial runs: not retrained again meanwhile
        clock.now += settings.retrain_lease_s + 1  # `first` stops renewing, as a dead one would
        assert other.hold() and not first.hold()
    finally:
        stop(proc)
        store.close()


def test_a_killed_retrain_leaves_no_training_running(tmp_path: Path) -> None:
    """The child a retrain starts dies with it (PR_SET_PDEATHSIG): kill -9 of the retrainer stops the run."""
    pid_file = tmp_path / "child"
    code = (
        "import subprocess, sys; from retrainer.retrain import die_with_parent; "
        "p = subprocess.Popen(['sleep', '60'], preexec_fn=die_with_parent); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); p.wait()"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", timeout=30)
        child = int(pid_file.read_text())
        parent.kill()
        parent.wait()

        def child_gone() -> bool:
            try:
                return Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"  # reaped by init soon
            except FileNotFoundError:
                return True

        wait_until(child_gone)
    finally:
        parent.kill()


def test_the_retrainer_process_holds_the_lease_counts_and_gives_it_up_on_sigterm(tmp_path: Path) -> None:
    """A second retrainer on the host finds the metrics port taken: it says so and waits for the lease all the
    same. Without the events key neither starts: only events posted with a key may move a retrain."""
    port = free_port()
    env = {
        **os.environ,
        "SEQSERVE_ARTIFACTS_DIR": str(tmp_path / "arts"),
        "SEQSERVE_HISTORY_PATH": str(tmp_path / "h.sqlite3"),
        "SEQSERVE_API_URL": f"http://127.0.0.1:{free_port()}",  # nothing answers there
        "SEQSERVE_RETRAIN_CHECK_S": "0.2",
        "SEQSERVE_RETRAINER_METRICS_PORT": str(port),
    }
    keyless = subprocess.run([sys.executable, "-m", "retrainer"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert keyless.returncode != 0 and "SEQSERVE_EVENTS_API_KEY is not set" in keyless.stderr
    env["SEQSERVE_EVENTS_API_KEY"] = "events-key"
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    procs = [
        subprocess.Popen([sys.executable, "-m", "retrainer"], cwd=ROOT, env=env, stderr=log.open("w"))
        for log in logs[:1]
    ]
    store = SQLiteStore(tmp_path / "h.sqlite3")
    try:

        def scraped() -> str:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/metrics").text
            except httpx.TransportError:
                return ""

        wait_until(lambda: "seqserve_retrainer_lease_held 1.0" in scraped(), timeout=60)
        assert not store.take_lease(LEASE, "someone-else", ttl_s=60, now=time.time())
        procs.append(subprocess.Popen([sys.executable, "-m", "retrainer"], cwd=ROOT, env=env, stderr=logs[1].open("w")))
        wait_until(lambda: "checks every" in logs[1].read_text(), timeout=60)  # started, past the metrics port
        assert f"its metrics port {port} is taken" in logs[1].read_text() and procs[1].poll() is None
        for p in procs:
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 0
        assert store.take_lease(LEASE, "someone-else", ttl_s=60, now=time.time())  # given up, not left to expire
        assert "does not answer" in logs[0].read_text()
    finally:
        for p in procs:
            p.kill()
        store.close()


@pytest.mark.parametrize("entry", ["retrainer.retrainer", "retrainer.retrain"])
def test_a_bad_setting_stops_the_start_in_one_line_without_a_value(entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.setenv("SEQSERVE_RETRAIN_MIN_EVENTS", "not-a-number")
    monkeypatch.setenv("SEQSERVE_ADMIN_API_KEY", "s3cret-value")
    with pytest.raises(SystemExit) as stop:
        main = importlib.import_module(entry).main
        main([]) if entry == "retrainer.retrain" else main()  # no arguments: pytest's own are in sys.argv
    message = str(stop.value.code)
    assert "SEQSERVE_RETRAIN_MIN_EVENTS" in message and "not-a-number" not in message and "s3cret" not in message
