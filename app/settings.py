"""The settings of the deployment's processes; every value can be set by a SEQSERVE_* environment variable.

`DeploymentSettings`: what every process reads alike; `Settings`: the api's. The api's fields stay flat
(each is its variable's name), and each part of the api reads its own group, never the whole object:
`server` (the process and its connections), `limits` (request bounds), `store_args()`, `loop` (the
production loop, with its `probation`). docs/settings.md lists every variable.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.limits import CPU_MAX_BATCH, BatchPolicy, Limits
from app.store.histories import RECENT_KEEP_S
from models.queries import COARSE_FROM, LIVE_EVENTS

_BATCH = BatchPolicy()
_LIMITS = Limits()  # the request bounds' defaults live in Limits
# Settings that may also come from a file named by SEQSERVE_<NAME>_FILE.
SECRETS = ("admin_api_key", "events_api_key", "read_api_key", "redis_url", "redis_password")


@dataclass(frozen=True)
class ServerPolicy:
    """What `python -m app.server` reads: where it listens, its workers, what a connection may do."""

    host: str
    port: int
    workers: int
    drain_s: float
    keep_alive_s: float
    max_header_bytes: int
    request_read_timeout_s: float
    max_connections: int
    max_connections_per_client: int
    forwarded_allow_ips: str
    log_level: str


@dataclass(frozen=True)
class ProbationPolicy:
    """What probation reads (app/production/promotion.py): its span, its bounds and its evidence."""

    probation_s: float
    probation_max_s: float
    probation_min_lists: int
    probation_min_users: int
    probation_holdback: float
    probation_min_requests: int
    probation_max_5xx_rise: float
    probation_max_p99_ratio: float


@dataclass(frozen=True)
class LoopPolicy:
    """What the production loop reads (app/production/): online evaluation, trials, the promotion rule,
    probation. `scored`: whether events need a key, so that online figures may decide anything."""

    online_eval: bool
    online_window_s: float
    online_max_lists: int
    online_score_s: float
    new_versions: Literal["serve", "canary", "shadow", "interleave"]
    canary_share: float
    promote_min_lists: int
    promote_margin: float
    shadow_max_in_flight: int
    scored: bool
    probation: ProbationPolicy


def _group(cls: type[Any], settings: object, **values: Any) -> Any:
    """A group built from the settings' fields of the same names (and `values`)."""
    return cls(**{f.name: getattr(settings, f.name) for f in fields(cls) if f.name not in values}, **values)


class SettingsError(ValueError):
    """Settings that do not validate: each problem by its variable, never with a value.

    pydantic's own error text repeats the input (`input_value=...`), and for a check over the whole
    object that input is every setting, secrets included; even a truncated repr shows a value's ends.
    """

    def __init__(self, exc: ValidationError) -> None:
        lines = []
        for e in exc.errors(include_url=False, include_context=False, include_input=False):
            msg = e["msg"].removeprefix("Value error, ")
            name = "_".join(str(p) for p in e["loc"]).upper()
            name = name if name.startswith("SEQSERVE_") else f"SEQSERVE_{name}"
            lines.append(f"{name}: {msg}" if e["loc"] else msg)
        super().__init__("invalid settings: " + "; ".join(lines))


class DeploymentSettings(BaseSettings):
    """What every process of one deployment reads alike (the api, the retrainer, a retrain, the export):
    where the artifacts and the store are, the keys, and the log. Each process's own settings extend it:
    `Settings` (the api), retrainer.settings.RetrainerSettings."""

    # An empty variable is unset: docker-compose.yml passes `${SEQSERVE_ADMIN_API_KEY:-}`, and an empty
    # key must never switch admin on (an empty X-API-Key header would match it) nor lock /events.
    model_config = SettingsConfigDict(env_prefix="SEQSERVE_", env_file=None, env_ignore_empty=True)

    artifacts_dir: Path = Path("artifacts")  # the artifacts folder: <name>/<version>/ per model (docs/artifacts.md)
    log_level: str = "INFO"  # the log's level (DEBUG, INFO, WARNING, ERROR)
    json_logs: bool = True  # one JSON object per log line; false: plain text
    admin_api_key: SecretStr | None = None  # admin endpoints answer 403 while unset
    events_api_key: SecretStr | None = None  # when set, POST /events and GET /history need it (X-API-Key)
    # Stored histories are private once either key is set: GET /history and a /recommend query by
    # user_id need X-API-Key with one of the two (this one cannot write events). A query that carries
    # its own history needs none (docs/decisions/private-histories.md).
    read_api_key: SecretStr | None = None
    # Live user events (POST /events), read after the artifacts' own histories.
    # sqlite: one host; redis: one Redis server for several hosts; redis-cluster: a Redis Cluster (redis_url
    # names any node of it; docs/decisions/redis-cluster.md)
    history_store: Literal["sqlite", "redis", "redis-cluster"] = "sqlite"
    history_path: Path = Path("state/history.sqlite3")  # the SQLite store's file (not under the artifacts)
    redis_url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")  # may hold a password: never shown
    redis_password: SecretStr | None = None  # Redis AUTH password, when not in the URL (e.g. from a _FILE)
    redis_prefix: str = "seqserve:"  # key prefix, so several deployments can share one Redis
    # An event is acknowledged once this many replicas hold it too (Redis WAIT), within redis_wait_ms (else
    # 503, and the client's retry is a duplicate). 0: once the primary has it; a primary killed before its
    # replica read the newest events loses them in a failover (docs/decisions/redis-cluster.md).
    redis_wait_replicas: int = Field(default=0, ge=0)
    redis_wait_ms: int = Field(default=1000, ge=1)  # how long an event waits for redis_wait_replicas
    redis_buckets: int = Field(default=64, ge=1, le=16384)  # the cluster store's user buckets (hash tags)
    # How far back the Redis store keeps every user's events for recent activity (a social model's
    # windows, which follow its network's clock, must fit; SQLite reads its events table instead).
    recent_keep_s: float = Field(default=RECENT_KEEP_S, gt=0)
    # Newest live events kept and read per user, and apart from them the newest steps received from others (a
    # social model's targets): neither pushes out the other.
    live_events: int = Field(default=LIVE_EVENTS, ge=1)

    def __init__(self, **values: Any) -> None:
        error = None
        try:
            super().__init__(**values)
        except ValidationError as exc:
            error = SettingsError(exc)
        if error is not None:  # raised outside the handler: no __context__ holding pydantic's text
            raise error

    @model_validator(mode="before")
    @classmethod
    def _secrets_from_files(cls, data: Any) -> Any:
        """SEQSERVE_<NAME>_FILE: a secret read from a file (compose and Kubernetes secrets), so it never sits
        in an environment variable; a value given directly wins."""
        if not isinstance(data, dict):
            return data
        for name in SECRETS:
            path = os.environ.get(f"SEQSERVE_{name.upper()}_FILE", "").strip()
            if path and not data.get(name):
                try:
                    data[name] = Path(path).read_text().strip()
                except OSError as exc:
                    raise ValueError(f"SEQSERVE_{name.upper()}_FILE: cannot read the file ({exc.strerror})") from None
        return data

    @field_validator("admin_api_key", "events_api_key", "read_api_key", "redis_password")
    @classmethod
    def _blank_key_is_no_key(cls, v: SecretStr | None) -> SecretStr | None:
        return None if v is None or not v.get_secret_value().strip() else v

    @property
    def any_keys(self) -> tuple[SecretStr, ...]:
        """Every key set (admin, events, read); empty: an open deployment."""
        return tuple(k for k in (self.admin_api_key, self.events_api_key, self.read_api_key) if k is not None)

    @property
    def history_keys(self) -> tuple[SecretStr, ...]:
        """The keys that may read stored histories; empty: histories are public."""
        return tuple(k for k in (self.events_api_key, self.read_api_key) if k is not None)

    def store_args(self) -> dict[str, Any]:
        """The history store these settings name, as app.store.open_store's arguments."""
        return {
            "kind": self.history_store,
            "sqlite_path": self.history_path,
            "redis_url": self.redis_url.get_secret_value(),
            "redis_prefix": self.redis_prefix,
            "keep": self.live_events,
            "redis_password": self.redis_password.get_secret_value() if self.redis_password else None,
            "recent_keep_s": self.recent_keep_s,
            "redis_wait_replicas": self.redis_wait_replicas,
            "redis_wait_ms": self.redis_wait_ms,
            "redis_buckets": self.redis_buckets,
        }


class Settings(DeploymentSettings):
    """The api's settings (python -m app.server and its workers)."""

    device: str = Field(
        default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$"
    )  # auto: the first CUDA device if any, else the CPU
    half_precision: bool = False  # float16 weights on a CUDA device; ignored on the CPU
    # scores() as one traced graph (models/traced.py); a model that does not trace exactly stays eager
    trace_models: bool = True
    # Catalogs from this size on are ranked on the CPU from bfloat16 scores, certified exact, where that
    # is faster at load (models/coarse.py); 0 = never.
    coarse_ranking_from: int = Field(default=COARSE_FROM, ge=0)
    default_model: str | None = None  # None = the first model by name
    # Intra-op threads of each worker's model calls; 0 = one core left to the event loop: the worker's
    # share of the CPUs less one, at least 1 (docs/decisions/request-path-threads.md).
    torch_threads: int = Field(default=0, ge=0)
    # Request bounds: the OpenAPI document states these, and validation enforces exactly these.
    max_queries: int = Field(default=_LIMITS.max_queries, ge=1)  # queries per request
    max_k: int = Field(default=_LIMITS.max_k, ge=1)  # items (k) per query
    max_history: int = Field(
        default=_LIMITS.max_history, ge=1
    )  # history events per query (the model reads its most recent)
    max_exclude_items: int = Field(default=_LIMITS.max_exclude_items, ge=0)  # exclude_items per query
    max_total_k: int = Field(default=_LIMITS.max_total_k, ge=1)  # sum of k over a request's queries
    max_total_items: int = Field(
        default=_LIMITS.max_total_items, ge=1
    )  # history events + excluded items over a request
    max_events: int = Field(default=_LIMITS.max_events, ge=1)  # events per POST /events
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)  # a request body's bytes; 413 above
    # Bytes of request bodies over 64 KiB one worker holds at once (being received or served); a large
    # body that would pass it gets 503 with Retry-After. A body costs about twice its size while parsed.
    max_body_bytes_in_flight: int = Field(default=256 * 1024 * 1024, ge=1024)
    console: bool = True  # GET /console: a page to look at a model's answers for a user (public API only)
    # Dynamic micro-batching of concurrent requests (per model); defaults in BatchPolicy.
    batching: bool = _BATCH.enabled
    max_batch_size: int | None = Field(default=None, ge=1)  # queries per model call; None: 32 on the CPU, 256 on CUDA
    max_wait_ms: float = Field(default=_BATCH.max_wait_ms, ge=0)  # how long a batch waits for more queries
    max_queue: int = Field(default=_BATCH.max_queue, ge=1)  # waiting requests per model before 503
    request_timeout_s: float = Field(default=10.0, gt=0)  # 504 after this
    event_skew_s: float = Field(default=300.0, ge=0)  # events later than now + this are rejected
    # The process (python -m app.server): where it listens, how many workers, what a connection may do.
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)  # the port it listens on
    workers: int = Field(default=1, ge=1)  # processes on one port, each with its own models and batchers
    drain_s: float = Field(default=20.0, ge=0)  # on SIGTERM, answer what is in flight for up to this long
    keep_alive_s: float = Field(default=5.0, ge=1)  # an idle kept-alive connection is closed after this
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)  # request line + headers; 431 above
    request_read_timeout_s: float = Field(default=15.0, gt=0)  # whole request (headers, body) within; else 408
    max_connections: int = Field(default=1024, ge=1)  # open connections per worker; a new one past it: 503
    # Open connections from one peer address, per worker: behind a proxy every client shares its address,
    # so raise it there (docs/decisions/connection-limits.md).
    max_connections_per_client: int = Field(default=256, ge=1)
    # Peers whose X-Forwarded-For names the client (addresses or networks, comma-separated): the balancer
    # alone. The header of anyone else is ignored (docs/decisions/balancer.md).
    forwarded_allow_ips: str = "127.0.0.1"
    # Workers of one host agree through files here (the reload generation, each worker's versions);
    # None: <history_path>.state beside the SQLite history file.
    state_dir: Path | None = None
    reload_wait_s: float = Field(default=60.0, ge=0)  # POST /admin/reload waits this long for every worker
    load_timeout_s: float = Field(default=300.0, gt=0)  # a version not loaded within this is reported broken
    # Versions kept on disk per model name after each reload: the newest N, plus a pinned or serving one;
    # 0 keeps every version (and a read-only artifacts folder is never touched).
    keep_versions: int = Field(default=0, ge=0)
    housekeeping_s: float = Field(default=1.0, gt=0)  # how often a worker looks for a reload, sets its gauges
    # Online evaluation: each list served by user is scored against that user's next stored event within
    # the window (docs/decisions/online-evaluation.md). Lists kept per worker, at most (the oldest go first).
    online_eval: bool = True
    online_window_s: float = Field(
        default=3600.0, gt=0, le=86400.0
    )  # how long a served list waits for its user's next event
    online_max_lists: int = Field(default=200_000, ge=1)  # lists kept per worker, at most (the oldest go first)
    online_score_s: float = Field(default=0.25, gt=0)  # how often a worker scores its lists against new events
    # A user_id a version does not know, with no live events, is answered by the fallback: the items users took
    # over this recent window (counted by every worker from the store's arrivals), once at least
    # fallback_min_takes were taken in it; else the artifact's most popular (a result's `source` says which).
    fallback_window_s: float = Field(default=3600.0, gt=0, le=86400.0)
    fallback_min_takes: int = Field(default=20, ge=0)  # takes the window needs before the fallback ranks by them
    # What a reload does with a version newer than the live one: serve it ("serve"), or try it beside the
    # live one as a "canary" (SEQSERVE_CANARY_SHARE of the users), a "shadow" or an "interleave" candidate.
    new_versions: Literal["serve", "canary", "shadow", "interleave"] = "serve"
    canary_share: float = Field(default=0.1, gt=0, le=1)  # the users a canary answers
    # The promotion rule: a candidate is retired as soon as its online NDCG@10 is proved below the live
    # version's (an anytime-valid test, users as the unit), and promoted once it and the live version each have
    # this many scored lists since the trial began without that proof; 0 = only by the admin calls. It counts
    # lists: SEQSERVE_PROMOTE_MIN_EVENTS, its first name, is still read (the new name wins where both are set).
    promote_min_lists: int = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices(
            "promote_min_lists", "SEQSERVE_PROMOTE_MIN_LISTS", "promote_min_events", "SEQSERVE_PROMOTE_MIN_EVENTS"
        ),
    )
    # Non-inferiority: a candidate is promoted only once the lower end of its difference's anytime-valid
    # interval (at the tests' level) is above -promote_margin x the live version's users' mean NDCG@10; an
    # interval still unbounded (too few users to bound it) promotes nothing.
    promote_margin: float = Field(default=0.1, ge=0, le=1)
    shadow_max_in_flight: int = Field(default=2, ge=1)  # shadow query batches running at once, per worker
    # Probation: after a promotion (by the rule or the admin call), the new live version is watched until it is
    # confirmed or rolled back, never left undecided: rolled back as soon as its online NDCG@10 is proved below its
    # holdback's or below its own reference lists' (anytime-valid tests, users as the unit: docs/decisions/
    # sequential-tests.md), confirmed once probation_s has passed with each side holding probation_min_lists
    # scored lists from probation_min_users users and nothing found, rolled back if probation_max_s passes
    # first. 0 = no probation; without SEQSERVE_EVENTS_API_KEY no NDCG@10 is read (anyone could post the
    # events that decide it).
    probation_s: float = Field(default=3600.0, ge=0)
    probation_max_s: float = Field(default=21600.0, ge=0)  # rolled back when undecided after this
    probation_min_lists: int = Field(default=200, ge=1)  # scored lists each side needs before confirming
    probation_min_users: int = Field(default=5, ge=1)  # users those lists come from, at least
    # The replaced version's side: this share of the users keeps it during probation (the holdback, while no
    # trial runs), so both versions are measured over the same time; 0 = none: probation then reads the new
    # version's floor alone.
    probation_holdback: float = Field(default=0.1, ge=0, le=0.5)
    # ...and the answers each side computed for its users (by-user queries only, which need a key wherever one
    # is set), once each side has probation_min_requests: rolled back when the new version's 5xx share is
    # proved higher by more than probation_max_5xx_rise, or its p99 latency is above probation_max_p99_ratio
    # times the holdback's over the same time.
    probation_min_requests: int = Field(default=1000, ge=1)
    probation_max_5xx_rise: float = Field(default=0.01, ge=0, le=1)  # the 5xx share's rise that rolls back
    probation_max_p99_ratio: float = Field(default=1.5, gt=1)  # the p99 latency ratio that rolls back

    @model_validator(mode="after")
    def _in_flight_holds_a_body(self) -> Settings:
        if self.max_body_bytes_in_flight < self.max_body_bytes:
            raise ValueError("SEQSERVE_MAX_BODY_BYTES_IN_FLIGHT must be at least SEQSERVE_MAX_BODY_BYTES")
        return self

    @model_validator(mode="after")
    def _probation_bound_after_its_span(self) -> Settings:
        if self.probation_s and self.probation_max_s < self.probation_s:
            raise ValueError("SEQSERVE_PROBATION_MAX_S must be at least SEQSERVE_PROBATION_S")
        return self

    @model_validator(mode="after")
    def _rule_counts_authenticated_events(self) -> Settings:
        # The rule promotes or retires on the online figures, which /events writes: with /events open,
        # anyone could post the hits and misses that decide a trial (docs/decisions/online-evaluation.md).
        if self.promote_min_lists and self.events_api_key is None:
            raise ValueError(
                "SEQSERVE_PROMOTE_MIN_LISTS needs SEQSERVE_EVENTS_API_KEY: the promotion rule acts only on "
                "events posted with a key"
            )
        return self

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, v: str) -> str:
        for entry in v.split(","):
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{entry.strip()!r} is not an address or a network (e.g. 10.0.0.0/8)") from None
        return v

    def model_threads(self, device_type: str) -> int | None:
        """Threads for torch on `device_type`; None: leave torch's own choice (a GPU's host side)."""
        if self.torch_threads:
            return self.torch_threads
        if device_type != "cpu":
            return None
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, cores // self.workers - 1)

    @property
    def shared_dir(self) -> Path:
        """The folder the workers of one host share: state_dir, else one named after the SQLite file beside
        it, so two instances whose files share a folder never share reload state."""
        return self.state_dir or self.history_path.with_name(f"{self.history_path.name}.state")

    def batch_policy(self, device_type: str) -> BatchPolicy:
        """The batchers' policy for models on `device_type` ("cpu", "cuda")."""
        size = self.max_batch_size or (CPU_MAX_BATCH if device_type == "cpu" else _BATCH.max_batch_size)
        return BatchPolicy(self.batching, size, self.max_wait_ms, self.max_queue)

    @property
    def server(self) -> ServerPolicy:
        return _group(ServerPolicy, self)

    @property
    def probation(self) -> ProbationPolicy:
        return _group(ProbationPolicy, self)

    @property
    def loop(self) -> LoopPolicy:
        return _group(LoopPolicy, self, scored=self.events_api_key is not None, probation=self.probation)

    @property
    def limits(self) -> Limits:
        return Limits(
            max_queries=self.max_queries,
            max_k=self.max_k,
            max_history=self.max_history,
            max_exclude_items=self.max_exclude_items,
            max_total_k=self.max_total_k,
            max_total_items=self.max_total_items,
            max_events=self.max_events,
        )


@lru_cache
def get_settings() -> Settings:
    return Settings()


def main() -> int:
    """`python -m app.settings`: check the settings in this environment, say what is wrong and exit 2, else 0.
    Compose runs it before the api, so a setting that does not validate stops `up` with its reason
    instead of restarting the api in a loop."""
    try:
        Settings()
    except SettingsError as exc:  # its text names each variable and never a value
        print(f"seqserve: {exc}", file=sys.stderr)
        return 2
    print("seqserve: settings valid", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
