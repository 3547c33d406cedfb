"""The models the service holds: one entry per loaded model (its engine, its batcher, its version).

Every artifact name under the artifacts folder is loaded from its newest version that loads; a
version that fails for any reason is recorded (and logged with the detail) and the next older one
is tried, so one bad file never takes a model, or the service, down. A request leases the entry it
uses for its whole life; a reload swaps a new entry in and stops the old one's batcher only after
its last lease is returned, so a stopped batcher never receives work.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from app.batcher import MicroBatcher
from app.choices import Beside, VersionChoices
from app.errors import ModelUnavailable, UnknownModel
from app.limits import BatchPolicy
from app.store import HistoryStore, StoreError
from models.artifact import ArtifactError, artifact_names, check_regular_tree, read_manifest, version_key
from models.engine import Engine, EngineOptions, RecentActivity, UserHistories
from models.tasks import TASKS, Task

log = logging.getLogger(__name__)
PIN_GONE = "pinned version not on disk"
T = TypeVar("T")


def _freeze_heap() -> None:
    """Move what is loaded (id maps, histories: millions of objects for a large catalog) out of the
    garbage collector's reach. Otherwise every full collection walks them all: pauses of a few
    hundred milliseconds that showed as the p99 of every endpoint in the load benchmark
    (docs/decisions/gc-freeze.md)."""
    gc.collect()
    gc.freeze()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available")
    return dev


def public_reason(exc: BaseException) -> str:
    """What a client may see of a load failure: the file and the problem, never a path or a trace."""
    if isinstance(exc, ArtifactError):
        return str(exc)
    if isinstance(exc, StoreError):
        return "history store failed (see the service log)"
    return f"failed to load ({type(exc).__name__}; see the service log)"


@dataclass(eq=False)
class Served:
    """One loaded model: what a request leases for its whole life."""

    name: str
    task: Task
    engine: Engine[Any, Any, Any]
    batcher: MicroBatcher[Any, Any]
    folder: Path
    holders: int = 0
    retired: bool = False
    drained: asyncio.Event | None = None  # set once retired with no holder left
    # Set when this entry serves beside the live version: as a trial's candidate, or as a promotion's holdback.
    role: Beside | None = None

    version: str = field(init=False)  # the folder's name (kept: Path.name is computed on every call)

    def __post_init__(self) -> None:
        self.version = self.folder.name

    @property
    def route(self) -> str | None:
        """The name of the endpoint family that serves it (models.tasks.Task.route)."""
        return self.task.route


@contextmanager
def held(served: Served) -> Iterator[Served]:
    served.holders += 1
    try:
        yield served
    finally:
        served.holders -= 1
        if served.retired and served.holders == 0 and served.drained is not None:
            served.drained.set()


@dataclass
class LoadedModels:
    options: EngineOptions = field(default_factory=EngineOptions)
    policy: BatchPolicy = field(default_factory=BatchPolicy)
    histories: HistoryStore | None = None  # live events; dropped when an artifact trained on them loads
    on_batch: Callable[[str], Callable[[int, float], None]] | None = None  # model name -> batch observer
    # Model name, its newly opened engine: called before the engine serves (the catalog's rules, app/catalog.py).
    on_open: Callable[[str, Engine[Any, Any, Any]], None] | None = None
    models: dict[str, Served] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)  # "name/version" (or "name") -> public reason
    loadable: set[str] = field(default_factory=set)  # "name/version" that loaded here
    load_timeout_s: float = 300.0  # a version not loaded by then is recorded broken (its thread is abandoned)
    # Pins and candidates: read here, written by the production loop alone (app/choices.py).
    choices: VersionChoices = field(default_factory=VersionChoices)
    candidate_models: dict[str, Served] = field(default_factory=dict)  # model name -> what is loaded beside it
    _reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    @property
    def names(self) -> list[str]:
        return sorted(self.models)

    def default(self, route: str, preferred: str | None = None) -> str | None:
        """The model a request to `route` gets when it names none: the configured one if it serves the
        route, else the first by name of the route's own task, else of any task the route serves."""
        if preferred is not None and preferred in self.models and self.models[preferred].route == route:
            return preferred
        on_route = sorted((s.task.name != route, n) for n, s in self.models.items() if s.route == route)
        return on_route[0][1] if on_route else None

    @contextmanager
    def lease(
        self, name: str | None, route: str, preferred: str | None = None, *, loc: tuple[str, ...] = ("body", "model")
    ) -> Iterator[Served]:
        """The entry serving `name` (else the route's default), held until the block ends; errors point at `loc`."""
        chosen = name or self.default(route, preferred)
        served = self.models.get(chosen) if chosen else None
        if served is None or served.route != route:
            if chosen is None:
                raise ModelUnavailable(f"no model serving /{route.replace('_', '-')} is loaded", list(loc))
            failed = [k for k in self.broken if k == chosen or k.startswith(f"{chosen}/")]
            if served is None and failed:
                raise ModelUnavailable(f"model {chosen!r} failed to load: {self.broken[failed[0]]}", list(loc))
            here = sorted(n for n, s in self.models.items() if s.route == route)
            raise UnknownModel(f"unknown model {chosen!r} for this endpoint; loaded: {here}", list(loc))
        with held(served):
            yield served

    @contextmanager
    def lease_candidate(self, name: str) -> Iterator[Served | None]:
        """The candidate version of `name` on trial beside the live one, if any, held until the block ends."""
        candidate = self.candidate_models.get(name)
        if candidate is None:
            yield None
            return
        with held(candidate):
            yield candidate

    def load_all(self, root: Path) -> None:
        """Load every artifact name from its pinned version, else its newest that loads; failures are
        recorded, never fatal (a pinned version that fails gives way to the newest that loads)."""
        for name, folders in artifact_names(root).items():
            served = self._first_loadable(name, self._order(name, folders))
            if served is not None:
                self._install(served)
            self._load_candidate(name, folders)
        _freeze_heap()

    def _order(self, name: str, folders: list[Path]) -> list[Path]:
        """The versions `name` may serve, in the order to try them: every one, newest first; with a pin,
        the pinned one and then only older ones. A pin moved the model away from what is newer (a
        rollback, a bad release), so a pinned version that fails or is gone never hands it back to them."""
        pin = self.choices.pins.get(name)
        if pin is None:
            return folders
        self._note_pin_folder(name, pin, folders, serving=False)
        return [f for f in folders if f.name == pin] + [f for f in folders if version_key(f) < version_key(Path(pin))]

    def _note_pin_folder(self, name: str, pin: str, folders: list[Path], *, serving: bool) -> None:
        """Say (readiness, /versions, the log) when the pinned version's folder is gone; forget it once back."""
        key = f"{name}/{pin}"
        if any(f.name == pin for f in folders):
            if self.broken.get(key, "").startswith(PIN_GONE):
                del self.broken[key]
            return
        reason = PIN_GONE + ("; its loaded copy keeps serving" if serving else "; an older version serves")
        if self.broken.get(key) != reason:
            log.error("pinned version %s is not on disk%s", key, reason.removeprefix(PIN_GONE))
        self.broken[key] = reason

    def _forget_gone(self, every: Mapping[str, Sequence[Path]]) -> None:
        """Drop the broken record of a version whose folder is gone: readiness reports what is there (a pin
        whose folder went keeps its record: that is what it reports)."""
        for key in list(self.broken):
            name, _, version = key.partition("/")
            gone = version and version not in {f.name for f in every.get(name, ())}
            if gone and not self.broken[key].startswith(PIN_GONE):
                del self.broken[key]

    async def reload(self, root: Path) -> dict[str, dict[str, str]]:
        """Load every newer version beside the serving one, warm it, then swap it in.

        Reloads run one at a time. A version that fails leaves the current one serving (or an older
        version newer than it that loads); the old entry's batcher stops once its last lease is back.
        """
        async with self._reload_lock:
            report: dict[str, dict[str, str]] = {"loaded": {}, "unchanged": {}, "failed": {}, "candidates": {}}
            every = artifact_names(root)
            self._forget_gone(every)
            for name, folders in every.items():
                current = self.models.get(name)
                newer = folders[: folders.index(current.folder)] if current and current.folder in folders else folders
                pin = self.choices.pins.get(name)
                if pin is not None and current is not None and current.version == pin:
                    newer = []  # it serves already: its loaded copy goes on even if its folder is gone
                    self._note_pin_folder(name, pin, folders, serving=True)
                elif pin is not None:  # the pinned version, older or newer, else one older than it
                    newer = self._order(name, folders)
                if not newer:
                    report["unchanged"][name] = current.version if current else ""
                    continue
                served = await self._take_beside(name, pin)
                if served is None:
                    served = await asyncio.to_thread(self._first_loadable, name, newer)
                for key, reason in self.broken.items():
                    if key.startswith(f"{name}/") and key.split("/", 1)[1] in {f.name for f in newer}:
                        report["failed"][key] = reason
                if served is None:
                    continue
                old = self._install(served)
                report["loaded"][name] = served.version
                log.info("swapped in %s version %s", name, served.version)
                if old is not None and not await self._hold_back(old):
                    await self._retire(old)
            # After the live ones: a candidate never runs the live version.
            for name in set(self.candidate_models) | set(self.choices.candidates) | set(self.choices.holdbacks):
                old_candidate = self.candidate_models.get(name)
                await asyncio.to_thread(self._load_candidate, name, every.get(name, []))
                candidate = self.candidate_models.get(name)
                if candidate is not None and name in self.choices.candidates:
                    report["candidates"][name] = candidate.version
                if old_candidate is not None and candidate is not old_candidate:
                    await self._retire(old_candidate)
            _freeze_heap()
            return report

    async def close(self) -> None:
        """Answer what is queued, then stop every batcher's worker."""
        for served in [*self.models.values(), *self.candidate_models.values()]:
            await served.batcher.stop()

    def _load_candidate(self, name: str, folders: list[Path]) -> None:
        """Load (or drop) the version beside the live one of `name` to match the choices (a trial's candidate
        or a holdback); a version that fails is recorded broken and none runs beside. Touches
        `candidate_models` only: the caller retires a replaced entry."""
        wanted = self.choices.beside(name)
        current = self.candidate_models.get(name)
        live = self.models.get(name)
        if wanted is None or (live is not None and live.version == wanted.version):
            self.candidate_models.pop(name, None)
            return
        if current is not None and current.version == wanted.version:
            current.role = wanted  # the share or mode may have changed
            return
        folder = [f for f in folders if f.name == wanted.version]
        loaded = None
        if folder:
            loaded = self._first_loadable(name, folder, batcher_name=f"{name}:candidate", drop_trained=False)
        if loaded is None:
            log.error("%s %s/%s not loaded: none runs beside the live version", wanted.variant, name, wanted.version)
            self.candidate_models.pop(name, None)
            return
        loaded.role = wanted
        self.candidate_models[name] = loaded
        log.info("trying %s version %s as %s", name, wanted.version, wanted.variant)

    def prune(self, root: Path, keep: int, *, in_use: AbstractSet[str] = frozenset()) -> list[str]:
        """Delete the version folders of each name but its newest `keep` good ones (broken ones do not count),
        never the pinned one, the one serving here, the one beside it, nor any "name/version" in `in_use` (what
        other workers serve); -> each deleted.
        A folder that cannot be deleted (a read-only mount) is left, and logged."""
        removed = []
        for name, folders in artifact_names(root).items():
            spare = {
                self.choices.pins.get(name),
                self.models[name].version if name in self.models else None,
                beside.version if (beside := self.choices.beside(name)) is not None else None,
            }
            good = self._newest_good(name, folders, keep)
            for folder in folders:
                if folder in good or folder.name in spare or f"{name}/{folder.name}" in in_use:
                    continue
                try:
                    shutil.rmtree(folder)
                except OSError as exc:
                    log.warning("version %s/%s not deleted: %s", name, folder.name, exc.strerror)
                    continue
                self.broken.pop(f"{name}/{folder.name}", None)
                self.loadable.discard(f"{name}/{folder.name}")
                removed.append(f"{name}/{folder.name}")
        if removed:
            log.info("deleted versions beyond the newest %d: %s", keep, ", ".join(removed))
        return removed

    def _newest_good(self, name: str, folders: list[Path], keep: int) -> list[Path]:
        """The newest `keep` of `folders` known to load. One never loaded (a version published behind a pin)
        is opened first: "not known broken" is not good, or a broken newer version would take the place
        of the last good one."""
        good: list[Path] = []
        for folder in folders:
            if len(good) == keep:
                break
            key = f"{name}/{folder.name}"
            if key in self.broken or (key not in self.loadable and self.verify(name, folder) is not None):
                continue
            good.append(folder)
        return good

    def versions(self) -> dict[str, str]:
        """Model name -> the version serving it."""
        return {name: served.version for name, served in self.models.items()}

    def queue_depths(self) -> dict[str, int]:
        """Model name -> requests waiting in its batcher."""
        return {name: served.batcher.depth for name, served in self.models.items()}

    def health(self) -> dict[str, str]:
        """Models whose batcher cannot run normally, and why (an empty map when all are well)."""
        out = {}
        for name, s in self.models.items():
            if s.batcher.stopped:
                out[name] = "batcher stopped"
            elif s.batcher.restarts:
                out[name] = f"batcher worker restarted {s.batcher.restarts} time(s)"
        return out

    async def _take_beside(self, name: str, pin: str | None) -> Served | None:
        """The entry loaded beside the live one of `name` when it holds the pinned version (a promoted
        candidate, or a holdback rolled back to), to serve as the live one as it is: loaded and warm on every
        worker already, where a load as the pin lands would weigh on the answers probation then reads."""
        entry = self.candidate_models.get(name)
        if pin is None or entry is None or entry.version != pin:
            return None
        del self.candidate_models[name]
        entry.role = None
        entry.batcher.on_batch = self.on_batch(name) if self.on_batch else None  # counted as the live model's
        await asyncio.to_thread(self._drop_trained_events, entry.engine)  # as a live load does
        return entry

    async def _hold_back(self, old: Served) -> bool:
        """Keep the entry a promotion replaced as its holdback when the choices want one of that version: it
        goes on answering its share without a load (a load on every worker as the promotion lands raised
        the new version's p99, which probation then read as the new version's own)."""
        hold = self.choices.holdbacks.get(old.name)
        if hold is None or hold.version != old.version:
            return False
        previous = self.candidate_models.get(old.name)
        old.role = hold
        self.candidate_models[old.name] = old
        if previous is not None:
            await self._retire(previous)
        return True

    async def _retire(self, old: Served) -> None:
        old.retired = True
        if old.holders:
            old.drained = asyncio.Event()
            await old.drained.wait()
        await old.batcher.stop()  # answers what it had accepted

    def _first_loadable(
        self, name: str, folders: list[Path], *, batcher_name: str | None = None, drop_trained: bool = True
    ) -> Served | None:
        """The newest of `folders` that loads and warms up, each failure recorded on the way; the live
        events it was trained on leave the store. Not for a candidate: the live version, trained on
        less, still reads them."""
        for folder in folders:
            key = f"{name}/{folder.name}"
            try:
                served = self._load_within_deadline(name, folder, batcher_name or name, drop_trained)
            except Exception as exc:  # any defect of one artifact stays with that artifact
                self.broken[key] = public_reason(exc)
                cause = f" ({exc.__cause__})" if exc.__cause__ else ""
                log.error(
                    "artifact %s (%s) not loaded: %s%s",
                    key,
                    folder,
                    exc,
                    cause,
                    exc_info=not isinstance(exc, ArtifactError),
                )
                continue
            self.broken.pop(key, None)
            self.loadable.add(key)
            return served
        return None

    def verify(self, name: str, folder: Path) -> str | None:
        """Whether `folder` loads as a version of `name` (the one serving or on trial does): None, else why,
        recorded broken. The engine is let go once checked. For a version asked to serve (a pin, a
        rollback, a candidate), so that a choice is refused rather than kept and failing at a restart."""
        key = f"{name}/{folder.name}"
        if any(s.folder == folder for s in (self.models.get(name), self.candidate_models.get(name)) if s is not None):
            return None
        try:
            self._within_deadline(name, lambda: self._open(name, folder))
        except Exception as exc:  # any defect of the artifact: the choice is refused
            self.broken[key] = public_reason(exc)
            log.error(
                "artifact %s (%s) does not load: %s", key, folder, exc, exc_info=not isinstance(exc, ArtifactError)
            )
            return self.broken[key]
        self.broken.pop(key, None)
        self.loadable.add(key)
        return None

    def _load_within_deadline(self, name: str, folder: Path, batcher_name: str, drop_trained: bool) -> Served:
        return self._within_deadline(name, lambda: self._load(name, folder, batcher_name, drop_trained))

    def _within_deadline(self, name: str, load: Callable[[], T]) -> T:
        """`load()` in a thread of its own, given up after `load_timeout_s`: a read that never returns
        (a hung network mount, a file swapped for a FIFO after the check) cannot hold the reload lock
        or keep a fresh start from listening. The abandoned thread is a daemon and touches no shared state."""
        outcome: list[T | BaseException] = []
        done = threading.Event()

        def work() -> None:
            try:
                outcome.append(load())
            except BaseException as exc:  # handed to the caller below
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=work, name=f"load-{name}", daemon=True).start()
        if not done.wait(self.load_timeout_s):
            raise ArtifactError("version", f"not loaded within {self.load_timeout_s:g} s (SEQSERVE_LOAD_TIMEOUT_S)")
        got = outcome[0]
        if isinstance(got, BaseException):
            raise got
        return got

    def _open(self, name: str, folder: Path) -> tuple[Task, Engine[Any, Any, Any]]:
        """Check, open and warm one version's engine (touches no shared state: safe in a thread)."""
        check_regular_tree(folder)
        manifest = read_manifest(folder)
        task = TASKS.get(manifest.task)
        if task is None or task.route is None:
            raise ArtifactError("manifest.json", f"task {manifest.task!r} is not served by this service")
        if manifest.kind not in task.kinds:
            raise ArtifactError("manifest.json", f"kind {manifest.kind!r} does not belong to task {task.name!r}")
        engine = task.open(folder, self.options)
        engine.warm_up()
        return task, engine

    def _load(self, name: str, folder: Path, batcher_name: str, drop_trained: bool) -> Served:
        """Load and warm one version and drop the live events it was trained on (touches no shared state:
        safe in a thread)."""
        task, engine = self._open(name, folder)
        if self.on_open is not None:
            self.on_open(name, engine)
        horizon = self.histories.recent_horizon_s if self.histories is not None else None
        if isinstance(engine, RecentActivity) and horizon is not None and engine.recent_reach_s > horizon:
            log.warning(
                "%s: recent activity reaches %.0f s back, the store keeps %.0f s (SEQSERVE_RECENT_KEEP_S):"
                " older live events are not counted",
                name,
                engine.recent_reach_s,
                horizon,
            )
        if drop_trained:
            self._drop_trained_events(engine)
        observer = self.on_batch(batcher_name) if self.on_batch else None
        batcher: MicroBatcher[Any, Any] = MicroBatcher(engine.infer, self.policy, on_batch=observer)
        return Served(name=name, task=task, engine=engine, batcher=batcher, folder=folder)

    def _drop_trained_events(self, engine: Engine[Any, Any, Any]) -> None:
        """Drop the live events this artifact was trained on (once per data hash; walks the users with
        live events, never the artifact's). A store fault is logged, not fatal: the model still serves,
        and requests that need the store answer 503."""
        if self.histories is None or not isinstance(engine, UserHistories):
            return
        try:
            t0 = time.perf_counter()
            dropped = self.histories.drop_trained_events(
                engine.namespace, engine.manifest.data_hash, engine.stored_events
            )
            if dropped:  # None: this data hash was handled before; 0: no live event was in it
                log.info(
                    "history store namespace %s: %d live events the artifact was trained on dropped in %.1f s",
                    engine.namespace,
                    dropped,
                    time.perf_counter() - t0,
                )
        except StoreError as exc:
            log.error("could not drop trained live events of namespace %s: %s", engine.namespace, exc)

    def _install(self, served: Served) -> Served | None:
        """Swap `served` in under its name; returns the entry it replaced. Runs on the event loop (or
        before it starts), so a request leases either the old entry or the new one, whole."""
        old = self.models.get(served.name)
        self.models[served.name] = served
        m = served.engine.manifest
        log.info(
            "serving %s (%s, version %s) on %s, scores %s",
            served.name,
            m.kind,
            served.version,
            served.engine.device,
            served.engine.scoring,
        )
        return old
