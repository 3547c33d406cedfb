"""The retrainer: a long-running process that starts a warm retrain of a served model by itself when one
of its triggers fires, one at a time per deployment.

    python -m app.retrainer            (compose's `retrainer` service; scripts/retrainer.sh on a plain host)

Every SEQSERVE_RETRAIN_CHECK_S it takes (or renews) the deployment's lease in the store, so that of
several retrainers sharing a store one works and the others wait; a holder that dies stops renewing and
the next takes over once the lease runs out (SEQSERVE_RETRAIN_LEASE_S). Then, for each model it retrains
(SEQSERVE_RETRAIN_MODELS; by default every served model whose task retrains warm), unless a
trial of that model is running, its serving version is on probation (SEQSERVE_PROBATION_S since its
promotion: a retrain would start from a version not yet proved, and its trial would end the holdback
probation compares with), or its last retrain is within SEQSERVE_RETRAIN_COOLDOWN_S, it reads:
- events: own live events no served version was trained on (what a retrain would add), against
  SEQSERVE_RETRAIN_MIN_EVENTS;
- unknown: the share of own events stored over the last SEQSERVE_RETRAIN_WINDOW_S that name an item (a
  social model's target user) the serving version does not know (a by-user query is answered from these
  histories, so it is the share of users' recent steps a query could not use), against
  SEQSERVE_RETRAIN_UNKNOWN_SHARE;
- sag: the serving version's online NDCG@10 over that window against its level before it (the figures
  it was promoted on and served with since), when lower by more than the 95% interval of the difference;
- age: the serving version's age, against SEQSERVE_RETRAIN_MAX_AGE_H.
Each trigger that fires is logged with its figure and bound and counted; then `python -m app.retrain`
runs (niced, SEQSERVE_RETRAIN_THREADS threads) and asks the service to reload, where its
SEQSERVE_NEW_VERSIONS (canary by default in compose) and promotion rule decide. The run dies with this
process (a killed retrainer leaves no training behind), and a version is published only whole
(models/artifact.py); the next holder removes the temporary folders a killed run left.
Why each trigger and default: docs/decisions/retrainer.md.
"""

from __future__ import annotations

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
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from app.production import published
from app.promotion import Window, online_windows, sagged
from app.retrain import die_with_parent, served_models
from app.settings import Settings, SettingsError
from app.store import Arrival, Candidate, ProductionState, StoreError, open_store
from app.store.histories import HistoryStore
from models.artifact import TMP_PREFIX, ArtifactError, read_id_map, read_manifest
from models.ids import IdMap
from models.tasks import TASKS

log = logging.getLogger("app.retrainer")
LEASE = "retrainer"
STALE_TMP_S = 3600.0  # a version's temporary folder lives seconds (export to rename); older is a dead run's


@dataclass(frozen=True)
class Bounds:
    """The triggers' bounds (Settings' SEQSERVE_RETRAIN_*); 0 turns a trigger off."""

    min_events: int
    unknown_share: float
    sag: bool
    min_lists: int
    max_age_s: float

    @classmethod
    def of(cls, s: Settings) -> Bounds:
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
    age_s: float
    pending: int  # own live events no served version was trained on
    recent: int  # own events stored over the window
    recent_unknown: int  # of which name an item the serving version does not know
    before: Window  # the serving version's online figures before the window (its level when promoted)
    now: Window  # and over the window, as the live version


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
    if b.max_age_s and r.age_s >= b.max_age_s:
        out.append(
            Fired("age", r.age_s, b.max_age_s, f"version {r.age_s / 3600:.1f} h old, bound {b.max_age_s / 3600:g} h")
        )
    return out


def left_alone(cand: Candidate | None, version: str, *, now: float, probation_s: float) -> str | None:
    """Why the model serving `version`, whose last candidate is `cand`, is not retrained now; None: it may be."""
    if cand is None:
        return None
    if cand.running:
        return f"a trial running ({cand.version})"
    promoted = cand.ended if cand.outcome == "promoted" and cand.version == version else None
    if promoted is not None and now - promoted < probation_s:
        return f"{version} on probation since its promotion {now - promoted:.0f} s ago"
    return None


def warm_ids(task: str) -> str | None:
    """The id map file a task's warm retrain extends (models.tasks.Task.warm_ids); None: it has none."""
    row = TASKS.get(task)
    return row.warm_ids if row is not None else None


@dataclass
class Recent:
    """Own events stored over the last window per namespace: (time stored, item), read from the arrivals."""

    window_s: float
    seen: dict[str, deque[tuple[float, str]]] = field(default_factory=dict)

    def add(self, arrivals: list[Arrival], *, now: float) -> None:
        for a in arrivals:
            self.seen.setdefault(a.namespace, deque()).append((a.at, a.item))
        for q in self.seen.values():  # every namespace, read or not: the process runs for weeks
            while q and q[0][0] < now - self.window_s:
                q.popleft()

    def items(self, namespace: str) -> list[str]:
        return [item for _, item in self.seen.get(namespace, ())]


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
        settings: Settings,
        *,
        histories: HistoryStore,
        state: ProductionState,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        run: Callable[[str], int] | None = None,
    ) -> None:
        self.settings, self.histories, self.state, self.metrics, self.clock = settings, histories, state, metrics, clock
        self.bounds = Bounds.of(settings)
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.recent = Recent(settings.retrain_window_s)
        self.cursor: str | None = None
        self.last_run: dict[str, float] = {}
        self.held = False
        self.stopping = False  # set by stop(): a run it kills is "stopped", not "failed"
        self._known: dict[tuple[str, str], IdMap] = {}
        self.proc: subprocess.Popen[bytes] | None = None  # the retrain running now
        self.run = run or self.run_retrain

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
        """Remove the temporary version folders a killed run left (older than STALE_TMP_S)."""
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

    def read(self, name: str, version: str) -> Reading:
        now = self.clock()
        folder = self.settings.artifacts_dir / name / version
        manifest = read_manifest(folder)
        namespace = manifest.namespace
        items = self.recent.items(namespace)
        known = self.known(name, version, manifest.task)
        before, current = online_windows(self.state.online(name), version, since=now - self.settings.retrain_window_s)
        return Reading(
            name=name,
            version=version,
            age_s=now - born if (born := published(version)) else 0.0,
            pending=self.histories.pending(namespace),
            recent=len(items),
            recent_unknown=sum(i not in known for i in items),
            before=before,
            now=current,
        )

    def check(self) -> list[str]:
        """One check: the lease, the arrivals since the last check, each model's triggers, and a retrain
        of each model whose trigger fired. -> the models retrained."""
        if not self.hold():
            return []
        try:
            while True:
                self.cursor, got = self.state.arrivals(self.cursor, 5_000)
                self.recent.add(got, now=self.clock())
                if not got:
                    break
            candidates = self.state.candidates()
        except StoreError as exc:
            log.warning("retrainer: the store is away: %s", exc)
            return []
        done = []
        for name, version in self.chosen(self.served()):
            why_not = left_alone(candidates.get(name), version, now=self.clock(), probation_s=self.settings.probation_s)
            if why_not is not None:
                log.info("retrainer: %s not checked: %s", name, why_not)
                continue
            if self.clock() - self.last_run.get(name, -math.inf) < self.settings.retrain_cooldown_s:
                continue
            try:
                reading = self.read(name, version)
            except (ArtifactError, OSError, StoreError) as exc:
                log.warning("retrainer: %s/%s not read: %s", name, version, exc)
                continue
            why = fired(reading, self.bounds)
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
            outcome, code = self.retrain(name)
            done.append(name)
            log.warning(
                "retrainer: %s retrain %s%s (triggers: %s)",
                name,
                outcome,
                f" (exit status {code})" if outcome == "failed" else "",
                ", ".join(f.trigger for f in why),
            )
        return done

    def retrain(self, name: str) -> tuple[str, int]:
        """Run one retrain of `name`; -> its outcome and the run's exit status."""
        self.metrics.running.labels(name).set(1)
        try:
            code = self.run(name)
        finally:
            self.metrics.running.labels(name).set(0)
            self.last_run[name] = self.clock()
            self.metrics.last_run.labels(name).set(self.clock())
        outcome = {0: "published", 3: "held_back", -1: "lost_lease"}.get(code, "failed")
        if self.stopping and code != 0:
            outcome = "stopped"  # killed by this process's own stop (SIGTERM), not a failure of the run
        self.metrics.runs.labels(name, outcome).inc()
        return outcome, code

    def run_retrain(self, name: str) -> int:
        """`python -m app.retrain NAME` as a niced child that dies with this process, renewing the lease
        while it runs; -1 (the child killed) when the lease was lost to another holder meanwhile."""
        s = self.settings
        cmd = [
            sys.executable,
            "-m",
            "app.retrain",
            name,
            "--minutes",
            str(s.retrain_minutes),
            "--threads",
            str(s.retrain_threads),
        ]
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
        settings = Settings()
    except SettingsError as exc:  # its text names each variable and never a value
        raise SystemExit(f"retrainer: {exc}") from None
    store = open_store(**settings.store_args())
    metrics = Metrics()
    if settings.retrainer_metrics_port:
        start_http_server(settings.retrainer_metrics_port, registry=metrics.registry)
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
