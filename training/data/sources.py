"""Where the default dataset comes from: ../shared/data, else the recbole wheel, else a user path."""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

RECBOLE_WHEEL = "recbole==1.2.1"
WHEEL_PREFIX = "recbole/dataset_example/ml-100k/"
FILES = ("ml-100k.inter", "ml-100k.item", "ml-100k.user")


def locate_ml100k(user_path: Path | None, shared: Path, cache: Path) -> Path:
    """Folder holding MovieLens-100k in RecBole atomic format; logs which source was used."""
    if user_path is not None:
        if not user_path.exists():
            raise FileNotFoundError(f"given data path {user_path} does not exist")
        log.info("ml-100k: using the path given: %s", user_path)
        return user_path
    if (shared / "ml-100k.inter").exists():
        log.info("ml-100k: using the shared copy at %s", shared)
        return shared
    if (cache / "ml-100k.inter").exists():
        log.info("ml-100k: using the copy extracted earlier at %s", cache)
        return cache
    log.info("ml-100k: %s absent; extracting it from the %s wheel on PyPI", shared, RECBOLE_WHEEL)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, RECBOLE_WHEEL],
            check=True,
        )
        wheel = next(Path(tmp).glob("recbole-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            for name in FILES:
                (cache / name).write_bytes(zf.read(WHEEL_PREFIX + name))
    return cache
