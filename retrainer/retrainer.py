"""The retrainer: a long-running process that starts a warm retrain of a served model by itself when one
of its triggers fires, one at a time per deployment.

    python -m retrainer            (compose's `retrainer` service; scripts/retrainer.sh on a plain host)

What it does at each check, why, and every setting it reads: docs/decisions/retrainer.md. In short:
the lease (one retrainer works per deployment), the models left alone (a trial running, a promotion on
probation, the cooldown or back-off since the last run, which the store keeps), the triggers (events,
unknown, sag, age), the version to start from (the serving one when it is a good start, else the last
good one), then `python -m retrainer.retrain` as a niced child whose folder is removed however it ends.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from app.production.promotion import Window, live_and_floor, online_windows, sagged
from app.production.sequential import Z95
from app.settings import SettingsError
from app.store import Arrival, Candidate, ProductionState, RetrainRecord, StoreError, open_store
from app.store.histories import HistoryStore
from models.artifact import HELD, TMP_PREFIX, ArtifactError, read_id_map, read_manifest
from models.ids import IdMap
from models.tasks import TASKS
from retrainer.retrain import HELD_KEPT, die_with_parent, new_run_folder, prune_held, served_models, sweep_runs
from retrainer.settings import RetrainerSettings

log = logging.getLogger("retrainer")
LEASE = "retrainer"
STALE_TMP_S = 3600.0  # a version's temporary folder lives seconds (export to rename); older is a dead run's
BUCKET_S = 60.0  # the unknown share's window is counted per minute
# A serving version whose online NDCG@10 (its 95% upper bound) is under this share of its own offline test
# figure is no start for a retrain: below any healthy version's ratio in the replays, far above a broken
# one's (docs/decisions/retrainer.md, "Where a run starts from").
FAR_BELOW = 0.5
ALERT_IN_A_ROW = 3  # runs in a row that publish nothing before an error (and SeqserveRetrainsUnpublished)


@dataclass(frozen=True)
class Bounds:
    """The triggers' bounds (RetrainerSettings' SEQSERVE_RETRAIN_*); 0 turns a trigger off."""

    min_events: int
    unknown_share: float
    sag: bool
    min_lists: int
    max_age_s: float

    @classmethod
    def of(cls, s: RetrainerSettings) -> Bounds:
        return cls(
            s.retrain_min_events,
            s.retrain_unknown_share,
            s.retrain_sag,
            s.retrain_min_lists,
            s.retrain_max_age_h * 3600,
        )


@dataclass(frozen=True)
class Reading:
    """What the retrainer reads about one served model at a check."""

    name: str
    version: str
    age_s: float | None  # since its manifest's created_at; None when the manifest does not say
    pending: int  # own live events no served version was trained on
    recent: int  # own events stored over the window
    recent_unknown: int  # of which name an item the serving version does not know
    before: Window  # the serving version's online figures before the window (its level when promoted)
    now: Window  # and over the window, as the live version
    floor: Window = field(default_factory=lambda: Window(0.0, 0.0, 0.0))  # its reference lists', same lists
    offline: float | None = None  # its offline test NDCG@10 (manifest)


@dataclass(frozen=True)
class Fired:
    trigger: str  # "events" | "unknown" | "sag" | "age"
    figure: float
    bound: float
    text: str


def fired(r: Reading, b: Bounds) -> list[Fired]:
    """The triggers that fire on `r` under `b`: each at its bound, never below it."""
    out = []
    if b.min_events and r.pending >= b.min_events:
        out.append(Fired("events", r.pending, b.min_events, f"{r.pending} new events, bound {b.min_events}"))
    if b.unknown_share and r.recent:
        share = r.recent_unknown / r.recent
        if share >= b.unknown_share:
            text = f"{r.recent_unknown} of {r.recent} recent events name unknown items ({share:.3f})"
            out.append(Fired("unknown", share, b.unknown_share, text))
    if b.sag and min(r.before.n, r.now.n) >= b.min_lists:
        drop, half = sagged(r.before, r.now)
        if drop > half:
            text = (
                f"online NDCG@10 {r.now.mean:.4f} over {int(r.now.n)} lists against {r.before.mean:.4f} over"
                f" {int(r.before.n)} before: {drop:.4f} lower, interval half-width {half:.4f}"
            )
            out.append(Fired("sag", drop, half, text))
    if b.max_age_s and r.age_s is not None and r.age_s >= b.max_age_s:
        out.append(
            Fired("age", r.age_s, b.max_age_s, f"version {r.age_s / 3600:.1f} h old, bound {b.max_age_s / 3600:g} h")
        )
    return out


def unfit(r: Reading, *, min_lists: int) -> str | None:
    """Why the serving version is no start for a warm retrain, else None: its online NDCG@10 over the window
    (once it has `min_lists` lists) far below its own offline figure, or below its reference lists' beyond
    the interval (lists as the unit). A retrain from it would carry what is wrong with it on."""
    if r.now.n >= min_lists and r.offline:
        upper = r.now.mean + Z95 * math.sqrt(r.now.var / r.now.n)
        if upper < FAR_BELOW * r.offline:
            return (
                f"online NDCG@10 {r.now.mean:.4f} over {int(r.now.n)} lists (95% upper bound {upper:.4f}), under"
                f" {FAR_BELOW:g} x its offline test figure {r.offline:.4f}"
            )
    if min(r.now.n, r.floor.n) >= min_lists:
        drop, half = sagged(r.floor, r.now)
        if drop > half:
            return (
                f"online NDCG@10 {r.now.mean:.4f} below its reference lists' {r.floor.mean:.4f} on the same"
                f" {int(r.now.n)} lists, {drop:.4f} lower, interval half-width {half:.4f}"
            )
    return None


def left_alone(cand: Candidate | None, pinned: str | None, *, now: float) -> str | None:
    """Why a model whose last candidate is `cand` and whose pin is `pinned` is not retrained now; None: it may
    be. Read from the store, not from what the service says it serves, which lags a promotion by a tick."""
    if cand is None:
        return None
    if cand.running:
        return f"a trial running ({cand.version})"
    if cand.on_probation and cand.version == pinned and cand.ended is not None:
        return f"{cand.version} on probation since its promotion {now - cand.ended:.0f} s ago"
    return None


def warm_ids(task: str) -> str | None:
    """The id map file a task's warm retrain extends (models.tasks.Task.warm_ids); None: it has none."""
    row = TASKS.get(task)
    return row.warm_ids if row is not None else None


@dataclass
class Recent:
    """Each model's own events stored over the last window, per minute: (minute, events, of which naming an
    id its serving version does not know), counted as they are read against that version, so the window
    costs a few numbers a minute whatever the traffic. A new serving version starts a new count."""

    window_s: float
    counts: dict[str, deque[list[float]]] = field(default_factory=dict)  # model -> [minute, events, unknown]
    versions: dict[str, str] = field(default_factory=dict)  # model -> the version its counts are against

    def add(
        self, name: str, version: str, arrivals: Sequence[Arrival], *, known: Callable[[str], bool], now: float
    ) -> None:
        """`arrivals` (the model's namespace's) counted for model `name` serving `version`."""
        if self.versions.get(name) != version:
            self.counts[name], self.versions[name] = deque(), version
        q = self.counts[name]
        for a in arrivals:
            minute = math.floor(a.at / BUCKET_S) * BUCKET_S
            if not q or q[-1][0] != minute:
                q.append([minute, 0.0, 0.0])
            q[-1][1] += 1
            q[-1][2] += not known(a.item)
        while q and q[0][0] + BUCKET_S <= now - self.window_s:
            q.popleft()

    def totals(self, name: str) -> tuple[int, int]:
        """(events, unknown) of model `name` over the window."""
        q = self.counts.get(name, ())
        return int(sum(c[1] for c in q)), int(sum(c[2] for c in q))


class Metrics:
    """The retrainer's decisions as Prometheus counters, on its own registry (it is not the api's process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.triggers = Counter(
            "seqserve_retrainer_triggers",
            "Triggers that fired, per model and trigger",
            ["model", "trigger"],
            registry=self.registry,
        )
        self.runs = Counter(
            "seqserve_retrainer_runs",
            "Retrains run, per model and outcome (published, held_back, failed, lost_lease, stopped)",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.skipped = Counter(
            "seqserve_retrainer_skipped",
            "Retrains a trigger asked for and not run, per model and reason (no_good_base)",
            ["model", "reason"],
            registry=self.registry,
        )
        self.unpublished = Gauge(
            "seqserve_retrainer_unpublished_in_a_row",
            "The model's last retrains in a row that published nothing (held back or failed)",
            ["model"],
            registry=self.registry,
        )
        self.last_run = Gauge(
            "seqserve_retrainer_last_run_end_seconds",
            "When the model's last retrain ended (Unix time)",
            ["model"],
            registry=self.registry,
        )
        self.running = Gauge(
            "seqserve_retrainer_running", "1 while a retrain of the model runs", ["model"], registry=self.registry
        )
        self.holding = Gauge(
            "seqserve_retrainer_lease_held",
            "1 while this retrainer holds the deployment's lease",
            registry=self.registry,
        )


class Retrainer:
    def __init__(
        self,
        settings: RetrainerSettings,
        *,
        histories: HistoryStore,
        state: ProductionState,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        run: Callable[[str, str], int] | None = None,
    ) -> None:
        self.settings, self.histories, self.state, self.metrics, self.clock = settings, histories, state, metrics, clock
        self.bounds = Bounds.of(settings)
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.recent = Recent(settings.retrain_window_s)
        self.cursor: str | None = None
        self.held = False
        self.stopping = False  # set by stop(): a run it kills is "stopped", not "failed"
        self._known: dict[tuple[str, str], IdMap] = {}
        self.proc: subprocess.Popen[bytes] | None = None  # the retrain running now
        self.run = run or self.run_retrain  # (model name, version to start from) -> exit status

    def hold(self) -> bool:
        """Take or renew the deployment's lease; on taking it, clear what a dead holder's run left."""
        try:
            held = self.state.take_lease(LEASE, self.holder, ttl_s=self.settings.retrain_lease_s, now=self.clock())
        except StoreError as exc:
            log.warning("retrainer: the store is away, nothing checked: %s", exc)
            held = False
        if held and not self.held:
            log.warning("retrainer %s holds the lease", self.holder)
            self.sweep()
        self.held = held
        self.metrics.holding.set(int(held))
        return held

    def sweep(self) -> None:
        """Remove what killed runs left: their own folders at once (no live run holds them), and temporary
        version folders of other jobs older than STALE_TMP_S; and all but the newest held-back versions."""
        for name in sweep_runs(self.settings.artifacts_dir):
            log.warning("retrainer: removed the folder of run %s, which did not finish", name)
        for held in sorted((self.settings.artifacts_dir / HELD).glob("*")):  # a `training warm` by hand's too
            for version in prune_held(held):
                log.info("retrainer: removed %s/%s, held back, past the newest %d kept", held.name, version, HELD_KEPT)
        for tmp in self.settings.artifacts_dir.glob(f"*/{TMP_PREFIX}*"):
            try:
                if self.clock() - tmp.stat().st_mtime > STALE_TMP_S:
                    shutil.rmtree(tmp)
                    log.warning("retrainer: removed %s, left by a run that did not finish", tmp.name)
            except OSError:
                continue

    def served(self) -> list[dict[str, object]]:
        """The service's models (GET /models); [] when it does not answer."""
        try:
            return served_models(self.settings.api_url)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("retrainer: the service at %s does not answer: %s", self.settings.api_url, exc)
            return []

    def chosen(self, models: list[dict[str, object]]) -> list[tuple[str, str]]:
        """(name, serving version) of the models this retrainer retrains."""
        names = [n.strip() for n in self.settings.retrain_models.split(",") if n.strip()]
        return [
            (str(m["name"]), str(m["version"]))
            for m in models
            if (m["name"] in names if names else warm_ids(str(m.get("task"))) is not None)
        ]

    def known(self, name: str, version: str, task: str) -> IdMap:
        """The ids `version` of `name` ranks (its task's warm_ids map), read once per version."""
        if (name, version) not in self._known:
            ids = warm_ids(task)
            if ids is None:
                raise ArtifactError("manifest.json", f"task {task!r} has no warm retrain")
            self._known[(name, version)] = read_id_map(self.settings.artifacts_dir / name / version, ids)
        return self._known[(name, version)]

    def count(self, arrivals: Sequence[Arrival], models: list[tuple[str, str]]) -> None:
        """The arrivals read at this check, counted for each model that reads their namespace."""
        now = self.clock()
        for name, version in models:
            try:
                manifest = read_manifest(self.settings.artifacts_dir / name / version)
                ids = self.known(name, version, manifest.task)
            except (ArtifactError, OSError) as exc:
                log.warning("retrainer: %s/%s not read: %s", name, version, exc)
                continue
            mine = [a for a in arrivals if a.namespace == manifest.namespace]
            self.recent.add(name, version, mine, known=ids.__contains__, now=now)

    def read(self, name: str, version: str) -> Reading:
        now = self.clock()
        manifest = read_manifest(self.settings.artifacts_dir / name / version)
        online = self.state.online(name)
        since = now - self.settings.retrain_window_s
        before, current = online_windows(online, version, since=since)
        recent, unknown = self.recent.totals(name)
        return Reading(
            name=name,
            version=version,
            age_s=now - born if (born := manifest.created) is not None else None,
            pending=self.histories.pending(manifest.namespace),
            recent=recent,
            recent_unknown=unknown,
            before=before,
            now=current,
            floor=live_and_floor(online, version, since=since)[1],
            offline=manifest.test_ndcg10,
        )

    def waits(self, record: RetrainRecord, *, now: float) -> str | None:
        """Why a model whose retrainer record is `record` is not retrained yet: its cooldown since the last run,
        doubled per run in a row that published nothing (at least one training budget, at most
        SEQSERVE_RETRAIN_BACKOFF_MAX_S); None once it may be."""
        if record.ended is None:
            return None
        s = self.settings
        wait = s.retrain_cooldown_s
        if record.in_a_row:
            base = max(s.retrain_cooldown_s, s.retrain_minutes * 60)
            wait = min(base * 2 ** (record.in_a_row - 1), max(s.retrain_backoff_max_s, base))
        left = record.ended + wait - now
        if left <= 0:
            return None
        backed = f", backed off after {record.in_a_row} in a row unpublished" if record.in_a_row else ""
        return f"last retrain {record.outcome} {now - record.ended:.0f} s ago; next in {left:.0f} s{backed}"

    def check(self) -> list[str]:
        """One check: the lease, the arrivals since the last check, each model's triggers, and a retrain
        of each model whose trigger fired. -> the models retrained."""
        if not self.hold():
            return []
        models = self.chosen(self.served())
        try:
            while True:
                self.cursor, got = self.state.arrivals(self.cursor, 5_000)
                self.count(got, models)
                if not got:
                    break
            candidates, pins = self.state.candidates(), self.state.pins()
        except StoreError as exc:
            log.warning("retrainer: the store is away: %s", exc)
            return []
        done = []
        for name, version in models:
            why_not = left_alone(candidates.get(name), pins.get(name), now=self.clock())
            if why_not is not None:
                log.info("retrainer: %s not checked: %s", name, why_not)
                continue
            try:
                record = self.state.retrain_record(name)
                if (wait := self.waits(record, now=self.clock())) is not None:
                    log.debug("retrainer: %s waits: %s", name, wait)
                    continue
                reading = self.read(name, version)
            except (ArtifactError, OSError, StoreError) as exc:
                log.warning("retrainer: %s/%s not read: %s", name, version, exc)
                continue
            why = fired(reading, self.bounds)
            base = self.base(reading, record, asked=bool(why))
            if not why:
                continue
            for f in why:
                log.warning(
                    "retrainer: %s/%s trigger %s fired, %g against %g: %s",
                    name,
                    version,
                    f.trigger,
                    f.figure,
                    f.bound,
                    f.text,
                )
                self.metrics.triggers.labels(name, f.trigger).inc()
            if base is None:
                self.metrics.skipped.labels(name, "no_good_base").inc()
                continue
            outcome, code = self.retrain(name, base)
            done.append(name)
            log.warning(
                "retrainer: %s retrain %s%s from %s (triggers: %s)",
                name,
                outcome,
                f" (exit status {code})" if outcome == "failed" else "",
                base,
                ", ".join(f.trigger for f in why),
            )
        return done

    def base(self, reading: Reading, record: RetrainRecord, *, asked: bool) -> str | None:
        """The version a retrain of the model would start from: the serving one when it is a good start (then
        remembered as the last good one), else the last good one still on disk; None when there is none.
        `asked`: a trigger fired (only then is a bad start logged)."""
        name, version = reading.name, reading.version
        why = unfit(reading, min_lists=self.bounds.min_lists)
        if why is None:
            if record.good != version:
                self.state.set_retrain_record(name, dataclasses.replace(record, good=version))
            return version
        good = record.good
        usable = good is not None and good != version and (self.settings.artifacts_dir / name / good).is_dir()
        if asked and usable:
            log.warning(
                "retrainer: %s/%s is no start (%s): the retrain starts from %s, the last good", name, version, why, good
            )
        elif asked:
            log.error(
                "retrainer: %s/%s is no start (%s) and no good version is known: not retrained", name, version, why
            )
        return good if usable else None

    def retrain(self, name: str, base: str) -> tuple[str, int]:
        """Run one retrain of `name` from version `base`; -> its outcome and the run's exit status. Its record
        (when it ended, how, the runs in a row that published nothing) goes to the store."""
        self.metrics.running.labels(name).set(1)
        try:
            code = self.run(name, base)
        finally:
            self.metrics.running.labels(name).set(0)
            self.metrics.last_run.labels(name).set(self.clock())
            sweep_runs(self.settings.artifacts_dir)  # a run killed outright leaves its folder unlocked
        outcome = {0: "published", 3: "held_back", -1: "lost_lease"}.get(code, "failed")
        if self.stopping and code != 0:
            outcome = "stopped"  # killed by this process's own stop (SIGTERM), not a failure of the run
        self.metrics.runs.labels(name, outcome).inc()
        try:
            record = self.state.retrain_record(name)
            in_a_row = {"published": 0, "stopped": record.in_a_row}.get(outcome, record.in_a_row + 1)
            self.state.set_retrain_record(
                name, dataclasses.replace(record, ended=self.clock(), outcome=outcome, base=base, in_a_row=in_a_row)
            )
            self.metrics.unpublished.labels(name).set(in_a_row)
            if in_a_row >= ALERT_IN_A_ROW:
                log.error(
                    "retrainer: %s: %d retrains in a row published nothing (the last %s)", name, in_a_row, outcome
                )
        except StoreError as exc:
            log.error("retrainer: %s's run not recorded (the store is away): %s", name, exc)
        return outcome, code

    def run_retrain(self, name: str, base: str) -> int:
        """`python -m retrainer.retrain NAME --from BASE` as a niced child that dies with this process, renewing the
        lease while it runs; -1 (the child killed) when the lease was lost to another holder meanwhile."""
        s = self.settings
        cmd = [sys.executable, "-m", "retrainer.retrain", name, "--from", base, "--minutes", str(s.retrain_minutes)]
        cmd += ["--threads", str(s.retrain_threads), "--work", str(new_run_folder(s.artifacts_dir))]
        if s.api_url:
            cmd += ["--api-url", s.api_url]

        def start() -> None:
            os.nice(s.retrain_nice)
            die_with_parent()

        self.proc = proc = subprocess.Popen(cmd, preexec_fn=start)  # nothing but nice and prctl runs there
        try:
            while True:
                try:
                    return proc.wait(timeout=s.retrain_lease_s / 3)
                except subprocess.TimeoutExpired:
                    if not self.hold():
                        log.error("retrainer: lost the lease while retraining %s; the run is stopped", name)
                        proc.kill()
                        proc.wait()
                        return -1
        finally:
            self.proc = None

    def stop(self) -> None:
        """SIGTERM: the run in progress is killed (it publishes nothing half-written) and no check follows."""
        self.stopping = True
        if self.proc is not None:
            self.proc.kill()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = RetrainerSettings()
    except SettingsError as exc:  # its text names each variable and never a value
        raise SystemExit(f"retrainer: {exc}") from None
    if settings.events_api_key is None:
        # Its triggers count stored events: with /events open, anyone could start retrains (and, with
        # SEQSERVE_NEW_VERSIONS=serve, put one live for everyone).
        raise SystemExit(
            "retrainer: SEQSERVE_EVENTS_API_KEY is not set: the retrainer acts on stored events, and only events"
            " posted with a key may move it (set the service's events key here too)"
        )
    store = open_store(**settings.store_args())
    metrics = Metrics()
    if settings.retrainer_metrics_port:
        try:
            start_http_server(settings.retrainer_metrics_port, registry=metrics.registry)
        except OSError as exc:  # a second retrainer on one host: it waits for the lease all the same
            log.error(
                "retrainer: its metrics port %d is taken (%s): no metrics served by this one (set"
                " SEQSERVE_RETRAINER_METRICS_PORT)",
                settings.retrainer_metrics_port,
                exc.strerror,
            )
    retrainer = Retrainer(settings, histories=store, state=store, metrics=metrics)
    stop = threading.Event()

    def on_term(*_: object) -> None:
        stop.set()
        retrainer.stop()

    signal.signal(signal.SIGTERM, on_term)
    log.warning(
        "retrainer %s: checks every %g s; triggers: events %d, unknown share %g, sag %s, age %g h",
        retrainer.holder,
        settings.retrain_check_s,
        settings.retrain_min_events,
        settings.retrain_unknown_share,
        settings.retrain_sag,
        settings.retrain_max_age_h,
    )
    try:
        while not stop.is_set():
            try:
                retrainer.check()
            except Exception:  # a check that fails is logged and the next one runs
                log.exception("retrainer: the check failed")
            stop.wait(settings.retrain_check_s)
    finally:
        if retrainer.held:
            store.drop_lease(LEASE, retrainer.holder)
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
