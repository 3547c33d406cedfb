"""The one settings class; every value can be set by a SEQSERVE_* environment variable."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SEQSERVE_", env_file=None)

    artifacts_dir: Path = Path("artifacts")
    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    half_precision: bool = False  # float16 weights on a CUDA device; ignored on the CPU
    default_model: str | None = None  # None = the first model by name
    torch_threads: int = Field(default=0, ge=0)  # 0 = leave torch's default
    max_queries: int = Field(default=1024, ge=1)  # queries per request
    max_k: int = Field(default=1000, ge=1)
    max_history: int = Field(default=2000, ge=1)  # history events per query (the model reads its most recent)
    log_level: str = "INFO"
    json_logs: bool = True
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    admin_api_key: str | None = None  # admin endpoints answer 403 while unset
    bench_endpoints: bool = False  # POST /bench/noop: the framework's ceiling, for bench/load.py
    # Dynamic micro-batching of concurrent requests (per model).
    batching: bool = True
    max_batch_size: int = Field(default=256, ge=1)  # queries per model call
    max_wait_ms: float = Field(default=2.0, ge=0)  # longest wait for more when others are queued
    max_queue: int = Field(default=1024, ge=1)  # waiting requests per model before 503
    request_timeout_s: float = Field(default=10.0, gt=0)  # 504 after this
    # User histories: seeded from the artifacts, appended to by POST /events.
    history_store: Literal["sqlite", "redis"] = "sqlite"
    history_path: Path = Path("state/history.sqlite3")  # the SQLite store's file (not under the artifacts)
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "seqserve:"  # key prefix, so several deployments can share one Redis
    max_events: int = Field(default=1000, ge=1)  # events per POST /events


@lru_cache
def get_settings() -> Settings:
    return Settings()
