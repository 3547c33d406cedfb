"""The artifact folder contract, written by training and read by serving.

artifacts/<name>/<version>/
  manifest.json  model.pt  items.json  users.json  item_meta.json  histories.json
  metrics.json  run_config.json  curves.png
A version folder is published by renaming a complete temporary folder, so a reader never sees a
half-written one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from models.base import SequentialRecommender
from models.checkpoint import load_checkpoint
from models.features import BUCKETING
from models.ids import IdMap
from models.mhsa import MHSA

MANIFEST = "manifest.json"
WEIGHTS = "model.pt"
ITEMS = "items.json"
LOCATIONS = "locations.json"
USERS = "users.json"
ITEM_META = "item_meta.json"
HISTORIES = "histories.json"
METRICS = "metrics.json"
RUN_CONFIG = "run_config.json"
CURVES = "curves.png"
TMP_PREFIX = ".tmp-"


class ArtifactError(ValueError):
    """An artifact folder that is missing a file or holds one that does not parse."""


@dataclass
class RecArtifact:
    """Everything the service needs from a recommendation artifact."""

    path: Path
    manifest: dict[str, Any]
    kind: str
    model: SequentialRecommender
    items: IdMap
    users: IdMap
    release_unit: str | None
    release: dict[str, float]  # raw item id -> release time in release_unit
    histories: dict[str, list[tuple[str, float]]]  # raw user id -> [(raw item id, unix time)]


@dataclass
class LocArtifact:
    """Everything the service needs from a next-location artifact."""

    path: Path
    manifest: dict[str, Any]
    model: MHSA
    locations: IdMap
    users: IdMap


def new_version_dir(root: Path, name: str) -> Path:
    """A fresh temporary folder under root/name to fill before `publish`."""
    tmp = root / name / f"{TMP_PREFIX}{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    return tmp


def publish(tmp: Path, version: str) -> Path:
    """Atomically turn a filled temporary folder into the version folder."""
    final = tmp.parent / version
    if final.exists():
        raise FileExistsError(f"{final} already exists")
    os.replace(tmp, final)
    return final


def discard(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


def latest_versions(root: Path) -> dict[str, Path]:
    """Newest complete version folder of each artifact name under root (versions sort by time)."""
    out: dict[str, Path] = {}
    if not root.is_dir():
        return out
    for named in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        versions = sorted(v for v in named.iterdir() if v.is_dir() and not v.name.startswith(TMP_PREFIX))
        if versions:
            out[named.name] = versions[-1]
    return out


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=None, separators=(",", ":")))


def _read_json(folder: Path, name: str) -> Any:
    p = folder / name
    if not p.exists():
        raise ArtifactError(f"{folder}: missing {name}")
    try:
        return json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{p}: not valid JSON ({exc})") from exc


def read_manifest(folder: Path) -> dict[str, Any]:
    m = _read_json(folder, MANIFEST)
    if not isinstance(m, dict) or "kind" not in m or "version" not in m:
        raise ArtifactError(f"{folder / MANIFEST}: needs at least 'kind' and 'version'")
    return m


def _load_parts(
    folder: Path, map_location: str, id_files: tuple[str, ...]
) -> tuple[dict[str, Any], str, nn.Module, list[IdMap]]:
    """Manifest, checkpoint and id maps of a version folder; every defect is an ArtifactError."""
    manifest = read_manifest(folder)
    if not (folder / WEIGHTS).exists():
        raise ArtifactError(f"{folder}: missing {WEIGHTS}")
    try:
        kind, model = load_checkpoint(folder / WEIGHTS, map_location)
        maps = [IdMap.from_json(_read_json(folder, name)) for name in id_files]
    except ValueError as exc:
        raise ArtifactError(str(exc)) from exc
    if kind != manifest["kind"]:
        raise ArtifactError(f"{folder}: checkpoint kind {kind!r} != manifest kind {manifest['kind']!r}")
    return manifest, kind, model, maps


def load_rec_artifact(folder: Path, map_location: str = "cpu") -> RecArtifact:
    """Load and cross-check a recommendation artifact; raises ArtifactError on any defect."""
    manifest, kind, model, (items, users) = _load_parts(folder, map_location, (ITEMS, USERS))
    if not isinstance(model, SequentialRecommender):
        raise ArtifactError(f"{folder}: kind {kind!r} is not a recommender")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab != len(items):
        raise ArtifactError(f"{folder}: model vocabulary {vocab} != {len(items)} ids in {ITEMS}")
    meta = _read_json(folder, ITEM_META)
    raw_hist = _read_json(folder, HISTORIES)
    if not isinstance(meta, dict) or not isinstance(raw_hist, dict):
        raise ArtifactError(f"{folder}: {ITEM_META} and {HISTORIES} must be JSON objects")
    histories = {
        u: [(str(i), math.nan if t is None else float(t)) for i, t in evs] for u, evs in raw_hist.items()
    }
    model.eval()
    return RecArtifact(
        path=folder, manifest=manifest, kind=kind, model=model, items=items, users=users,
        release_unit=meta.get("unit"), release={str(k): float(v) for k, v in meta.get("release", {}).items()},
        histories=histories,
    )


def load_location_artifact(folder: Path, map_location: str = "cpu") -> LocArtifact:
    """Load and cross-check a next-location artifact; raises ArtifactError on any defect."""
    manifest, _, model, (locations, users) = _load_parts(folder, map_location, (LOCATIONS, USERS))
    if manifest.get("bucketing") != BUCKETING:
        # The features would be computed differently from how the model was trained.
        raise ArtifactError(f"{folder}: bucketing {manifest.get('bucketing')} differs from this code's {BUCKETING}")
    if not isinstance(model, MHSA):
        raise ArtifactError(f"{folder}: checkpoint is not a next-location model")
    if model.config.n_locations != len(locations) or model.config.n_users != len(users):
        raise ArtifactError(f"{folder}: model vocabularies do not match {LOCATIONS}/{USERS}")
    model.eval()
    return LocArtifact(folder, manifest, model, locations, users)
