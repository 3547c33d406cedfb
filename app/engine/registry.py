"""The models the service holds: every artifact under the artifacts folder, and the broken ones."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from app.engine.batcher import MicroBatcher, Q, R
from app.engine.locator import Locator, LocPrepared, LocQuery, LocResult, LocStep
from app.engine.recommender import Prepared, Recommender, RecQuery, RecResult
from models.artifact import (
    ArtifactError,
    latest_versions,
    load_location_artifact,
    load_rec_artifact,
    read_manifest,
)

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available")
    return dev


@dataclass
class BatchPolicy:
    enabled: bool = True
    max_batch_size: int = 256
    max_wait_ms: float = 2.0
    max_queue: int = 1024


@dataclass
class ModelRegistry:
    device: torch.device
    policy: BatchPolicy = field(default_factory=BatchPolicy)
    on_batch: Callable[[str], Callable[[int, float], None]] | None = None  # model name -> batch observer
    rec_batchers: dict[str, MicroBatcher[Prepared, RecResult]] = field(default_factory=dict)
    loc_batchers: dict[str, MicroBatcher[LocPrepared, LocResult]] = field(default_factory=dict)
    recommenders: dict[str, Recommender] = field(default_factory=dict)
    locators: dict[str, Locator] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)
    default: str | None = None  # default recommendation model
    default_locator: str | None = None

    @property
    def names(self) -> list[str]:
        return sorted([*self.recommenders, *self.locators])

    def load_all(self, root: Path, default: str | None = None) -> None:
        """Load the newest version of every artifact; a bad one is recorded, never fatal."""
        for name, folder in latest_versions(root).items():
            try:
                manifest = read_manifest(folder)
                task = manifest.get("task", "recommend")
                if task == "recommend":
                    rec = Recommender(load_rec_artifact(folder), self.device)
                    rec.recommend([RecQuery(None, [(rec.art.items.raw(2) or "", None)], k=1)])  # warm-up
                    self.recommenders[name] = rec
                    self.rec_batchers[name] = self._batcher(name, rec.infer)
                elif task == "next_location":
                    loc = Locator(load_location_artifact(folder), self.device)
                    loc.predict([LocQuery(None, [LocStep(loc.art.locations.raw(2) or "", 0, 0, 0)])])  # warm-up
                    self.locators[name] = loc
                    self.loc_batchers[name] = self._batcher(name, loc.infer)
                else:
                    raise ArtifactError(f"task {task!r} is not served by this version")
                log.info("loaded %s (%s, version %s) on %s", name, manifest["kind"], manifest["version"], self.device)
            except (ArtifactError, OSError, RuntimeError, ValueError) as exc:
                self.broken[name] = str(exc)
                log.error("artifact %s not loaded: %s", name, exc)
        if default is not None and default not in self.recommenders:
            self.broken.setdefault(default, "configured default model is not loaded")
        self.default = default if default in self.recommenders else next(iter(sorted(self.recommenders)), None)
        self.default_locator = next(iter(sorted(self.locators)), None)

    def _batcher(self, name: str, fn: Callable[[list[Q]], list[R]]) -> MicroBatcher[Q, R]:
        p = self.policy
        observer = self.on_batch(name) if self.on_batch else None
        return MicroBatcher(fn, p.max_batch_size, p.max_wait_ms, p.max_queue, enabled=p.enabled, on_batch=observer)

    async def close(self) -> None:
        """Answer what is queued, then stop every batcher's worker."""
        for rb in self.rec_batchers.values():
            await rb.stop()
        for lb in self.loc_batchers.values():
            await lb.stop()
