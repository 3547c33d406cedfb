"""Fixtures of the service's tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

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
