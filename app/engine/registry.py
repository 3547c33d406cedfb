"""The models the service holds: every artifact under the artifacts folder, and the broken ones."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from app.engine.recommender import Recommender
from models.artifact import ArtifactError, latest_versions, load_rec_artifact, read_manifest

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available")
    return dev


@dataclass
class ModelRegistry:
    device: torch.device
    recommenders: dict[str, Recommender] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)
    default: str | None = None

    def load_all(self, root: Path, default: str | None = None) -> None:
        """Load the newest version of every artifact; a bad one is recorded, never fatal."""
        for name, folder in latest_versions(root).items():
            try:
                manifest = read_manifest(folder)
                task = manifest.get("task", "recommend")
                if task != "recommend":
                    raise ArtifactError(f"task {task!r} is not served by this version")
                rec = Recommender(load_rec_artifact(folder), self.device)
                self.warm_up(rec)
                self.recommenders[name] = rec
                log.info("loaded %s (%s, version %s) on %s", name, rec.art.kind, manifest["version"], self.device)
            except (ArtifactError, OSError, RuntimeError, ValueError) as exc:
                self.broken[name] = str(exc)
                log.error("artifact %s not loaded: %s", name, exc)
        if default is not None and default not in self.recommenders:
            self.broken.setdefault(default, "configured default model is not loaded")
        self.default = default if default in self.recommenders else next(iter(sorted(self.recommenders)), None)

    @staticmethod
    def warm_up(rec: Recommender) -> None:
        from app.engine.recommender import RecQuery

        first = rec.art.items.raw(2)
        rec.recommend([RecQuery(None, [(first or "", None)], k=1)])
