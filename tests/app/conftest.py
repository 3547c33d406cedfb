"""Fixtures of the service's tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.store import HistoryStore, ProductionState, RedisClusterStore, RedisStore, SQLiteStore
from models.artifact import latest_versions
from tests.servers import NEWER


@pytest.fixture
def root(tiny_artifacts: Path, tmp_path: Path) -> Path:
    """The tiny artifacts with a second, newer version of sasrec-tiny (a copy of the first)."""
    out = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, out)
    old = latest_versions(out)["sasrec-tiny"]
    shutil.copytree(old, old.parent / NEWER)
    return out


@pytest.fixture(params=["sqlite", "redis", "redis-cluster"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore | RedisStore]:
    """Each store backend, keeping 5 live events a user; it serves both interfaces."""
    s: SQLiteStore | RedisStore
    if request.param == "sqlite":
        s = SQLiteStore(tmp_path / "h.sqlite3", keep=5)
    elif request.param == "redis":
        s = RedisStore(request.getfixturevalue("redis_server").url, keep=5)
    else:  # eight buckets: a test's few users fall in several, so calls span slots and nodes
        s = RedisClusterStore(request.getfixturevalue("redis_cluster").url, keep=5, buckets=8)
    yield s
    s.close()


@pytest.fixture
def histories(backend: SQLiteStore | RedisStore) -> HistoryStore:
    """The history store interface of each backend."""
    return backend


@pytest.fixture
def state(backend: SQLiteStore | RedisStore) -> ProductionState:
    """The production state interface of each backend (the same connection as `histories`)."""
    return backend
