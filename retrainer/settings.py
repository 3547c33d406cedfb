"""The retrainer's settings (python -m retrainer) and a retrain's (python -m retrainer.retrain, and the
export it runs): the deployment's shared ones (where the artifacts and the store are, the keys) and their
own, each `SEQSERVE_*` name as before. The api neither reads nor validates these."""

from __future__ import annotations

from pydantic import Field

from app.settings import DeploymentSettings


class RetrainerSettings(DeploymentSettings):
    # The retrainer (python -m retrainer) and one retrain (python -m retrainer.retrain): when a warm retrain
    # starts by itself, and what it may take from the box (docs/decisions/retrainer.md). 0 turns a trigger off.
    # The retrainer starts only with SEQSERVE_EVENTS_API_KEY set: its triggers count stored events.
    api_url: str = ""  # the running service: its /models says what serves, /admin/reload takes a new version
    retrain_models: str = ""  # comma-separated names; "" = every served model whose task retrains warm
    retrain_minutes: float = Field(default=0.5, gt=0)  # one warm retrain's training budget
    retrain_model: str = "sasrec-ml100k"  # what `python -m retrainer.retrain` retrains when no name is given
    retrain_check_s: float = Field(default=60.0, gt=0)  # how often the triggers are read
    retrain_min_events: int = Field(default=5000, ge=0)  # new own events no served version was trained on
    retrain_unknown_share: float = Field(default=0.05, ge=0, le=1)  # of the window's events, naming unknown items
    retrain_window_s: float = Field(default=3600.0, gt=0)  # the recent window of the unknown share and the sag
    retrain_sag: bool = True  # online NDCG@10 over the window below the version's earlier level, beyond the interval
    # Scored lists each side needs before the sag is judged, and the window before the serving version is judged
    # no start for a retrain (far below its offline figure, or its floor, online).
    retrain_min_lists: int = Field(default=200, ge=1)
    retrain_max_age_h: float = Field(default=168.0, ge=0)  # the serving version's age, from its manifest
    retrain_cooldown_s: float = Field(default=3600.0, ge=0)  # after a model's retrain, its next at the earliest
    # After runs in a row that published nothing (held back by the gate, or failed), the next waits the
    # cooldown (at least one training budget) doubled per run, up to this.
    retrain_backoff_max_s: float = Field(default=86400.0, ge=0)
    retrain_threads: int = Field(default=1, ge=0)  # the training job's threads (0: torch's default, every core)
    retrain_nice: int = Field(default=10, ge=0, le=19)  # the training job's nice level (the api keeps the CPU first)
    retrain_lease_s: float = Field(default=120.0, gt=0)  # a dead retrainer's lease is taken over after this
    retrainer_metrics_port: int = Field(default=9101, ge=0, le=65535)  # its Prometheus counters; 0 = none
