"""The models the service holds: every artifact under the artifacts folder, and the broken ones."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from app.engine.batcher import MicroBatcher, Q, R
from app.engine.locator import Locator, LocPrepared, LocQuery, LocResult, LocStep
from app.engine.recommender import Prepared, Recommender, RecQuery, RecResult
from app.store import HistoryStore, StoreError
from models.artifact import (
    ArtifactError,
    latest_versions,
    load_location_artifact,
    load_rec_artifact,
    read_manifest,
)

log = logging.getLogger(__name__)
LOAD_ERRORS = (ArtifactError, OSError, RuntimeError, ValueError)


def _freeze_heap() -> None:
    """Move what is loaded (id maps, histories: millions of objects for a large catalog) out of the
    garbage collector's reach. Otherwise every full collection walks them all: pauses of a few
    hundred milliseconds that showed as the p99 of every endpoint in the load benchmark."""
    gc.collect()
    gc.freeze()


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
    half_precision: bool = False  # float16 on CUDA only
    rec_batchers: dict[str, MicroBatcher[Prepared, RecResult]] = field(default_factory=dict)
    loc_batchers: dict[str, MicroBatcher[LocPrepared, LocResult]] = field(default_factory=dict)
    recommenders: dict[str, Recommender] = field(default_factory=dict)
    locators: dict[str, Locator] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)
    default: str | None = None  # default recommendation model
    default_locator: str | None = None
    store: HistoryStore | None = None  # seeded with each recommendation artifact's histories

    @property
    def names(self) -> list[str]:
        return sorted([*self.recommenders, *self.locators])

    def load_all(self, root: Path, default: str | None = None) -> None:
        """Load the newest version of every artifact; a bad one is recorded, never fatal."""
        for name, folder in latest_versions(root).items():
            try:
                self._install(name, self._load(folder))
            except LOAD_ERRORS as exc:
                self.broken[name] = str(exc)
                log.error("artifact %s not loaded: %s", name, exc)
        if default is not None and default not in self.recommenders:
            self.broken.setdefault(default, "configured default model is not loaded")
        self._pick_defaults(default)
        _freeze_heap()

    async def reload(self, root: Path, default: str | None = None) -> dict[str, dict[str, str]]:
        """Load every new version beside the serving one, warm it, then swap it in.

        A version that fails to load leaves the old one serving; the error is reported.
        """
        report: dict[str, dict[str, str]] = {"loaded": {}, "unchanged": {}, "failed": {}}
        for name, folder in latest_versions(root).items():
            current = self._served(name)
            if current is not None and current.art.path == folder:
                report["unchanged"][name] = folder.name
                continue
            try:
                served = await asyncio.to_thread(self._load, folder)
            except LOAD_ERRORS as exc:
                report["failed"][name] = str(exc)
                if current is None:
                    self.broken[name] = str(exc)
                log.error("reload of %s from %s failed; %s", name, folder, "old version keeps serving"
                          if current is not None else "not serving")
                continue
            old_batcher = self._install(name, served)
            self.broken.pop(name, None)
            report["loaded"][name] = folder.name
            log.info("swapped in %s version %s", name, folder.name)
            if old_batcher is not None:
                await old_batcher.stop()  # answers what it had accepted
        self._pick_defaults(default)
        _freeze_heap()
        return report

    def _served(self, name: str) -> Recommender | Locator | None:
        return self.recommenders.get(name) or self.locators.get(name)

    def _load(self, folder: Path) -> Recommender | Locator:
        """Load and warm one artifact version (no shared state touched: safe in a thread)."""
        manifest = read_manifest(folder)
        task = manifest.get("task", "recommend")
        half = self.half_precision and self.device.type == "cuda"
        if task == "recommend":
            rec = Recommender(load_rec_artifact(folder), self.device, half)
            rec.recommend([RecQuery(None, [(rec.art.items.raw(2) or "", None)], k=1)])
            self._seed(rec)
            # The store and Recommender.stored hold them now: free the raw (str, float) copies.
            rec.art.histories.clear()
            return rec
        if task == "next_location":
            loc = Locator(load_location_artifact(folder), self.device, half)
            loc.predict([LocQuery(None, [LocStep(loc.art.locations.raw(2) or "", 0, 0, 0)])])
            return loc
        raise ArtifactError(f"task {task!r} is not served by this version")

    def _seed(self, rec: Recommender) -> None:
        """Seed the store with the artifact's histories (once per data hash); a store fault is logged,
        not fatal: the model still serves, and requests that need the store answer 503."""
        if self.store is None:
            return
        try:
            t0 = time.perf_counter()
            if self.store.seed(rec.namespace, rec.seed_token, rec.art.histories):
                log.info("seeded history store namespace %s with %d users in %.1f s", rec.namespace,
                         len(rec.art.histories), time.perf_counter() - t0)
        except StoreError as exc:
            log.error("could not seed history store namespace %s: %s", rec.namespace, exc)

    def _install(
        self, name: str, served: Recommender | Locator
    ) -> MicroBatcher[Prepared, RecResult] | MicroBatcher[LocPrepared, LocResult] | None:
        """Swap `served` in under `name`; returns the batcher it replaced. Runs on the event loop
        (or before it starts), so a request sees either the old model and batcher or the new ones."""
        old: MicroBatcher[Prepared, RecResult] | MicroBatcher[LocPrepared, LocResult] | None
        if isinstance(served, Recommender):
            old = self.rec_batchers.get(name)
            self.rec_batchers[name] = self._batcher(name, served.infer)
            self.recommenders[name] = served
        else:
            old = self.loc_batchers.get(name)
            self.loc_batchers[name] = self._batcher(name, served.infer)
            self.locators[name] = served
        log.info("serving %s (%s, version %s) on %s", name, served.art.manifest["kind"],
                 served.art.manifest["version"], self.device)
        return old

    def _pick_defaults(self, default: str | None) -> None:
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
