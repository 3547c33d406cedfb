"""The one settings class; every value can be set by a SEQSERVE_* environment variable."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SEQSERVE_", env_file=None)

    artifacts_dir: Path = Path("artifacts")
    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    default_model: str | None = None  # None = the first model by name
    torch_threads: int = Field(default=0, ge=0)  # 0 = leave torch's default
    max_queries: int = Field(default=1024, ge=1)  # queries per request
    max_k: int = Field(default=1000, ge=1)
    log_level: str = "INFO"


@lru_cache
def get_settings() -> Settings:
    return Settings()
