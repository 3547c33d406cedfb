"""The artifact folder contract, written by training and read by serving.

artifacts/<name>/<version>/
  manifest.json  model.pt  <id maps>.json  <task files>.json  histories/  metrics.json  run_config.json
  curves.png
A version folder is published by renaming a complete temporary folder, so a reader never sees a
half-written one. Version folders are named by the UTC time of the run (20261122T111403Z, with a
-2, -3 ... suffix when two runs finish in the same second); nothing else under a name is a version.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any, TypeVar

import torch
from pydantic import TypeAdapter, ValidationError

from models import activity, history_table
from models.checkpoint import CheckpointError, load_checkpoint
from models.ids import IdMap
from models.manifest import Manifest, ManifestError

MANIFEST = "manifest.json"
WEIGHTS = "model.pt"
ITEMS = "items.json"
LOCATIONS = "locations.json"
USERS = "users.json"
ACTIONS = "actions.json"
ITEM_META = "item_meta.json"
ITEM_FIELDS = "item_fields.json"  # optional display fields: {"fields": {name: {raw item id: value}}}
USER_META = "user_meta.json"  # social: each user's first activity (the "future" exclusion)
HISTORIES = history_table.FOLDER  # users' final histories, memory-mapped columns (models/history_table.py)
EVENTS = activity.FOLDER  # social, with recent activity: the log in time order (models/activity.py)
OLD_HISTORIES = "histories.json"  # the earlier layout: one JSON object, parsed into every worker
METRICS = "metrics.json"
RUN_CONFIG = "run_config.json"
CURVES = "curves.png"
TMP_PREFIX = ".tmp-"
# Versions a warm retrain held back (its test figure fell below its parent's bound): under the artifacts
# folder, as <HELD>/<name>/<version>; a folder starting with "." is never a model, so nothing serves them.
HELD = ".held"
# A warm retrain's own folder while it runs (its exported log, its training job's output): <RUNS>/<run>,
# under the artifacts folder so that its version moves into place by a rename (retrainer/retrain.py).
RUNS = ".runs"
VERSION_NAME = re.compile(r"^\d{8}T\d{6}Z(-\d+)?$")
T = TypeVar("T")


class ArtifactError(ValueError):
    """A version folder missing a file or holding one that does not parse.

    The message names the file inside the version folder and the problem, never an absolute path:
    it is safe to show to a client (the logs add the folder).
    """

    def __init__(self, file: str, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file, self.problem = file, problem


def version_time(version: str) -> float:
    """The UTC time a version folder's name states (what orders versions); 0 for a name that states none. A
    version's age is its manifest's (Manifest.created), not this: a copied folder keeps its name."""
    try:
        return dt.datetime.strptime(version[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return 0.0


def version_key(folder: Path) -> tuple[str, int]:
    """Orders version folders by when they were written (their name's UTC time, then its "-N")."""
    base, _, suffix = folder.name.partition("-")
    return base, int(suffix or 1)


def versions(named: Path) -> list[Path]:
    """Complete version folders of one artifact name, newest first."""
    try:  # a name the file system refuses (too long, not a folder) has no versions
        found = [v for v in named.iterdir() if VERSION_NAME.match(v.name) and v.is_dir()]
    except OSError:
        return []
    return sorted(found, key=version_key, reverse=True)


def artifact_names(root: Path) -> dict[str, list[Path]]:
    """Every artifact name under root with its version folders, newest first (names without one left out)."""
    if not root.is_dir():
        return {}
    out = {}
    for named in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found = versions(named)
        if found:
            out[named.name] = found
    return out


def latest_versions(root: Path) -> dict[str, Path]:
    """Newest version folder of each artifact name under root."""
    return {name: found[0] for name, found in artifact_names(root).items()}


def new_version_dir(root: Path, name: str) -> Path:
    """A fresh temporary folder under root/name to fill before `publish`."""
    tmp = root / name / f"{TMP_PREFIX}{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    return tmp


def publish(tmp: Path, version: str, *, into: Path | None = None) -> Path:
    """Atomically turn a filled temporary folder into the version folder (suffixed if taken), beside it or
    in `into` (a model's folder on the same file system: a run's own folder hands its version over so)."""
    suffix = 1
    parent = into or tmp.parent
    parent.mkdir(parents=True, exist_ok=True)
    while True:
        final = parent / (version if suffix == 1 else f"{version}-{suffix}")
        if not final.exists():
            try:
                os.rename(tmp, final)  # fails if another writer took the name meanwhile
                return final
            except OSError:
                if not final.exists():
                    raise
        suffix += 1


def discard(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


def check_regular_tree(folder: Path) -> None:
    """Refuse a version folder holding anything but regular files and folders (a FIFO, a device, a
    socket, a link to one): opening a FIFO blocks the loading thread forever. Each entry is looked at
    with stat(), which never opens it."""
    pending = [folder]
    while pending:
        here = pending.pop()
        with os.scandir(here) as entries:
            for entry in entries:
                try:
                    mode = os.stat(entry.path).st_mode  # through a link: what would be opened
                except OSError:
                    raise ArtifactError(_relative(entry.path, folder), "unreadable or a broken link") from None
                if stat.S_ISDIR(mode):
                    pending.append(Path(entry.path))
                elif not stat.S_ISREG(mode):
                    raise ArtifactError(_relative(entry.path, folder), "not a regular file; refused")


def _relative(path: str, folder: Path) -> str:
    return Path(path).relative_to(folder).as_posix()


def read_regular(path: Path, *, max_bytes: int | None = None) -> bytes:
    """A regular file's bytes, opened without blocking (never a FIFO's writer wait) and checked as a
    regular file on the open descriptor; OSError when it is not one or is larger than `max_bytes`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path.name}: not a regular file")
        if max_bytes is not None and info.st_size > max_bytes:
            raise OSError(f"{path.name}: {info.st_size} bytes, over the {max_bytes} allowed")
        return f.read()


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=None, separators=(",", ":")))


def read_json(folder: Path, name: str, *, max_bytes: int | None = None) -> Any:
    """A JSON file of the version; `max_bytes` bounds what is parsed (a file too large is refused)."""
    p = folder / name
    if not p.is_file():
        raise ArtifactError(name, "missing")
    try:
        raw = read_regular(p, max_bytes=max_bytes)
    except OSError as exc:
        too_large = max_bytes is not None and p.stat().st_size > max_bytes
        raise ArtifactError(name, f"larger than {max_bytes} bytes" if too_large else "unreadable") from exc
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(name, f"not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
    except RecursionError:
        raise ArtifactError(name, "nested too deeply") from None


def read_typed(folder: Path, name: str, adapter: TypeAdapter[T], *, max_bytes: int | None = None) -> T:
    """A JSON file checked against a type; the first mismatch is named."""
    try:
        return adapter.validate_python(read_json(folder, name, max_bytes=max_bytes))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        raise ArtifactError(name, f"unexpected shape at {where}: {first['msg']}") from None


def read_manifest(folder: Path) -> Manifest:
    try:
        return Manifest.from_json(read_json(folder, MANIFEST))
    except ManifestError as exc:
        raise ArtifactError(MANIFEST, str(exc)) from None


def read_id_map(folder: Path, name: str) -> IdMap:
    try:
        return IdMap.from_json(read_json(folder, name))
    except (ValueError, TypeError, AttributeError) as exc:
        if isinstance(exc, ArtifactError):
            raise
        raise ArtifactError(name, f"not an id map ({exc})") from None


def read_history_table(
    folder: Path, *, n_ids: int | None = None, n_actions: int | None = None
) -> history_table.HistoryTable:
    """The version's history table, its steps checked against the id maps' sizes; an artifact of the
    earlier JSON layout is refused with the command that converts it."""
    if not (folder / HISTORIES).is_dir() and (folder / OLD_HISTORIES).is_file():
        raise ArtifactError(
            OLD_HISTORIES,
            "histories in the earlier JSON layout; convert the version with "
            "`python -m training convert-histories <version folder>`",
        )
    try:
        return history_table.HistoryTable(folder / HISTORIES, n_ids=n_ids, n_actions=n_actions)
    except history_table.HistoryTableError as exc:
        raise ArtifactError(HISTORIES, str(exc)) from None


def read_model(folder: Path, manifest: Manifest, expected: type[Any], map_location: str | torch.device = "cpu") -> Any:
    """The checkpoint of a version folder, rebuilt and checked against the manifest and the expected class."""
    try:
        kind, model = load_checkpoint(folder / WEIGHTS, map_location)
    except CheckpointError as exc:
        raise ArtifactError(WEIGHTS, exc.problem) from exc  # the cause, with its detail, goes to the log
    if kind != manifest.kind:
        raise ArtifactError(WEIGHTS, f"checkpoint kind {kind!r} != manifest kind {manifest.kind!r}")
    if not isinstance(model, expected):
        raise ArtifactError(WEIGHTS, f"kind {kind!r} is not a {expected.__name__}")
    model.eval()
    return model


def check(condition: bool, file: str, problem: str) -> None:
    if not condition:
        raise ArtifactError(file, problem)


def read_event_log(folder: Path) -> activity.EventLog:
    """The version's event log in time order (a social model with recent activity)."""
    try:
        return activity.EventLog.read(folder / EVENTS)
    except history_table.HistoryTableError as exc:
        raise ArtifactError(EVENTS, str(exc)) from None
