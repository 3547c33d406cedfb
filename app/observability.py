"""Prometheus metrics, request ids and JSON logs."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from app.store import Exposure, Sums
from app.store.state import segment_parts
from app.workers import alive

_LIVE_GAUGE = re.compile(r"^gauge_live\w*_(\d+)\.db$")
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """One registry per app, so several apps in one process (tests) never collide."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "seqserve_requests_total", "HTTP requests", ["endpoint", "model", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "seqserve_request_seconds",
            "HTTP request latency",
            ["endpoint", "model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "seqserve_batch_size", "Queries per model call", ["model"], buckets=BATCH_BUCKETS, registry=self.registry
        )
        self.batch_seconds = Histogram(
            "seqserve_batch_seconds", "Model call time", ["model"], buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.queue_depth = Gauge(
            "seqserve_queue_depth",
            "Requests waiting for a model call",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        # Requests the app has started and not yet answered: what a graceful stop still owes.
        self.in_progress = Gauge(
            "seqserve_requests_in_progress",
            "HTTP requests being handled",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.rejected = Counter(
            "seqserve_rejected_total", "Requests refused or failed, by reason", ["reason"], registry=self.registry
        )
        labels = ["model", "version", "variant"]
        self.online_scored = Counter(
            "seqserve_online_scored",
            "Served lists scored against the user's next event",
            labels,
            registry=self.registry,
        )
        self.online_hits = Counter(
            "seqserve_online_hits", "Scored lists holding the next item in their top 10", labels, registry=self.registry
        )
        self.online_ndcg = Counter(
            "seqserve_online_ndcg", "Sum of NDCG@10 of scored lists", labels, registry=self.registry
        )
        self.online_rr = Counter(
            "seqserve_online_rr", "Sum of reciprocal ranks of scored lists", labels, registry=self.registry
        )
        self.online_unscored = Counter(
            "seqserve_online_unscored",
            "Served lists dropped unscored: superseded by a newer one, expired, or evicted by the bounds",
            ["reason"],
            registry=self.registry,
        )
        self.shadow_shed = Counter(
            "seqserve_shadow_shed",
            "Shadow query batches dropped (load) or failed",
            ["model", "reason"],
            registry=self.registry,
        )
        self.interleave_credits = Counter(
            "seqserve_interleave_credits",
            "Interleaved answers scored, by the side the user's item credited (candidate, live, neither)",
            ["model", "side"],
            registry=self.registry,
        )
        self.online_attributed = Counter(
            "seqserve_online_attributed",
            "Served lists scored by an event naming their recommendation_id (the rest of"
            " seqserve_online_scored_total: by the user's next event)",
            ["model", "version", "variant"],
            registry=self.registry,
        )
        segment_labels = ["model", "version", "variant", "users", "items"]
        self.online_segment_scored = Counter(
            "seqserve_online_segment_scored",
            "Scored lists by segment: users the serving version's artifact held (known) or not (new); lists holding"
            " an item first seen live (fresh) or not (catalog)",
            segment_labels,
            registry=self.registry,
        )
        self.online_segment_ndcg = Counter(
            "seqserve_online_segment_ndcg",
            "Sum of NDCG@10 of scored lists by segment",
            segment_labels,
            registry=self.registry,
        )
        self.exposure_slots = Counter(
            "seqserve_exposure_slots",
            "Item slots of the by-user lists shown (their top 10)",
            ["model", "version", "variant"],
            registry=self.registry,
        )
        self.exposure_head_slots = Counter(
            "seqserve_exposure_head_slots",
            "Item slots shown holding one of the 1% most frequent items of the version's data",
            ["model", "version", "variant"],
            registry=self.registry,
        )
        self.exposure_coverage = Gauge(
            "seqserve_exposure_coverage",
            "Distinct items shown over the online window as a share of the catalog, every worker and host",
            ["model", "version", "variant"],
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.candidate_failures = Counter(
            "seqserve_candidate_failures",
            "Interleaved candidates' answers that failed; the live version's answers were served alone",
            ["model", "mode"],
            registry=self.registry,
        )
        self.trial_changes = Counter(
            "seqserve_candidate_changes",
            "Candidate trials started, promoted and retired; promotions kept or rolled back by probation",
            ["model", "action"],
            registry=self.registry,
        )
        # Each model's serving version's publish time (its manifest's): what an operator alerts on when the
        # loop stops replacing versions (ops/prometheus/alerts.yml, SeqserveModelStale).
        self.model_published = Gauge(
            "seqserve_model_published_seconds",
            "When each model's serving version was published (Unix time, its manifest's created_at)",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        # Each live version against its floor over the online window (ProductionLoop.floors): after probation,
        # what an alert reads (SeqserveBelowFloor). Unset while either side has too few lists.
        self.floor_gap = Gauge(
            "seqserve_online_floor_gap",
            "The live version's online NDCG@10 less its reference lists' on the same events, over the online window",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livemin",
        )
        self.below_floor = Gauge(
            "seqserve_online_below_floor",
            "1 while the live version's online NDCG@10 is below its reference lists' beyond the 95% interval",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        # The serving version's test figure over its own run's best simple baseline (its manifest): a version
        # trained on too little serves (nothing else may be there to serve) but pages (SeqserveUnderBaseline).
        self.vs_baseline = Gauge(
            "seqserve_model_vs_best_baseline",
            "The serving version's offline test NDCG@10 over its run's best simple baseline's",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livemin",
        )
        # (endpoint, model, status) -> the two children a request updates: labels() hashes its values and
        # takes a lock on every call, most of what the Observe layer cost (docs/decisions/request-path-trims.md).
        self._request_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def observe_request(self, endpoint: str, model: str, status: int, seconds: float) -> None:
        """Count one HTTP request and record its latency."""
        key = (endpoint, model, status)
        children = self._request_children.get(key)
        if children is None:
            children = (self.requests.labels(endpoint, model, str(status)), self.latency.labels(endpoint, model))
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def observe_online(self, model: str, version: str, variant: str, scored: Sums, *, segment: str = "") -> None:
        labels = (model, version, variant)
        self.online_scored.labels(*labels).inc(scored.n)
        self.online_hits.labels(*labels).inc(scored.hits)
        self.online_ndcg.labels(*labels).inc(scored.ndcg)
        self.online_rr.labels(*labels).inc(scored.rr)
        if scored.attributed:
            self.online_attributed.labels(*labels).inc(scored.attributed)
        parts = segment_parts(segment)
        if parts is not None:
            by = (*labels, *parts)
            self.online_segment_scored.labels(*by).inc(scored.n)
            self.online_segment_ndcg.labels(*by).inc(scored.ndcg)

    def count_exposure(self, shown: Mapping[tuple[str, str, str], Exposure]) -> None:
        for labels, e in shown.items():
            self.exposure_slots.labels(*labels).inc(e.slots)
            self.exposure_head_slots.labels(*labels).inc(e.head)

    def set_coverage(self, model: str, coverage: Mapping[tuple[str, str], float]) -> None:
        for (version, variant), share in coverage.items():
            self.exposure_coverage.labels(model, version, variant).set(share)

    def count_candidate_failure(self, model: str, mode: str) -> None:
        self.candidate_failures.labels(model, mode).inc()

    def count_credits(self, credits: dict[tuple[str, str], int]) -> None:
        for (model, side), n in credits.items():
            self.interleave_credits.labels(model, side).inc(n)

    def count_unscored(self, **reasons: int) -> None:
        for reason, n in reasons.items():
            if n:
                self.online_unscored.labels(reason).inc(n)

    def count_shadow(self, shed: dict[str, int], failed: dict[str, int]) -> None:
        for reason, counts in (("load", shed), ("failed", failed)):
            for model, n in counts.items():
                self.shadow_shed.labels(model, reason).inc(n)

    def count_trial_change(self, model: str, action: str) -> None:
        self.trial_changes.labels(model, action).inc()

    def on_batch(self, model: str) -> Callable[[int, float], None]:
        size, seconds = self.batch_size.labels(model), self.batch_seconds.labels(model)

        def record(n: int, s: float) -> None:
            size.observe(n)
            seconds.observe(s)

        return record

    def set_published(self, published: dict[str, float]) -> None:
        for model, at in published.items():
            self.model_published.labels(model).set(at)

    def set_floor(self, model: str, read: tuple[float, bool] | None) -> None:
        """The live version against its floor: (gap, whether below beyond the interval); None: too few lists
        (the gap unknown, NaN; not below)."""
        gap, below = read if read is not None else (math.nan, False)
        self.floor_gap.labels(model).set(gap)
        self.below_floor.labels(model).set(int(below))

    def set_vs_baseline(self, ratios: dict[str, float]) -> None:
        for model, ratio in ratios.items():
            self.vs_baseline.labels(model).set(ratio)

    def set_queue_depths(self, depths: dict[str, int]) -> None:
        for model, depth in depths.items():
            self.queue_depth.labels(model).set(depth)

    @staticmethod
    def forget_dead_workers() -> None:
        """Drop the live gauges of worker processes that are gone (their counters stay in the sums):
        uvicorn restarts a dead worker but tells prometheus-client nothing."""
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not folder:
            return
        for pid in {int(m.group(1)) for f in os.listdir(folder) if (m := _LIVE_GAUGE.match(f))}:
            if not alive(pid):
                multiprocess.mark_process_dead(pid, folder)

    def render(self) -> bytes:
        """This process's metrics; with several workers (PROMETHEUS_MULTIPROC_DIR set, as
        scripts/serve.sh does for SEQSERVE_WORKERS > 1) every worker's, summed."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            self.forget_dead_workers()
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id.get(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class AccessLog:
    """The access log: one line per request, in the log's format, written in batches.

    Through `logging`, a line cost 10 us of the event loop (a LogRecord, the handler's lock, the
    formatter, a write and a flush per line): 21% of /recommend's throughput at 64 clients on the
    2-core box (docs/decisions/request-path-threads.md). Here a line is formatted directly and kept;
    the lines go out in one write every `flush_s` seconds, or at 256 lines, or at shutdown. The logger
    "app.access" still decides whether lines are written (its level), and nothing else logs through it.
    """

    def __init__(self, *, json_lines: bool, flush_s: float = 0.2, fd: int = 2) -> None:
        self.json_lines, self.flush_s, self.fd = json_lines, flush_s, fd
        self.logger = logging.getLogger("app.access")
        self._lines: list[bytes] = []
        self._second = -1
        self._stamp = ""
        self._timer: asyncio.TimerHandle | None = None

    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def write(self, message: str, rid: str) -> None:
        now = time.time()
        if int(now) != self._second:  # the time stamp changes once a second
            self._second = int(now)
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now))
        if self.json_lines:
            line = orjson.dumps(
                {"time": self._stamp, "level": "INFO", "logger": "app.access", "message": message, "request_id": rid}
            )
        else:
            line = f"{self._stamp} INFO app.access: {message}".encode()
        self._lines.append(line + b"\n")
        if len(self._lines) >= 256:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.flush_s, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._lines:
            data, self._lines = b"".join(self._lines), []
            with contextlib.suppress(OSError):  # a closed log stream must not fail requests
                os.write(self.fd, data)


def configure_logging(level: str, json_lines: bool = True) -> None:
    handler = logging.StreamHandler()
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
