"""One skeleton for every training job; each task fills in its data, model, metrics and artifact.

    run():  threads, seed, device (and the distributed set-up) -> prepare_data -> build_model
            -> preflight -> the training loop (best checkpoint by validation) -> after_training
            -> evaluate (test metrics, baselines) -> export (the artifact folder, one per run)

`train.max_minutes` is the whole job's budget once the data is loaded (`JobClock`): the training
loop gets it less what the job reserves for the phases after it (`after_reserve`), and those phases
size themselves to what is left (docs/decisions/job-budget.md). Only rank 0 of a torchrun job
evaluates and exports. Time spent evaluating inside the hooks is kept out of `train_seconds` by
wrapping it in `self.untimed()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import resource
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import nn

from models import artifact
from models.artifact import read_manifest
from models.ids import IdMap
from models.manifest import Manifest, vs_best_baseline
from models.warm import FIRST_SEEN_LIVE, Carried, added_live
from training.config import LoopConfig, RunConfig, parse
from training.distributed import Dist, resolve_device
from training.export import export_artifact
from training.loop import History, seed_everything, train
from training.memory import reuse_freed_memory

log = logging.getLogger(__name__)
D = TypeVar("D")
T = TypeVar("T", bound=LoopConfig)
E = TypeVar("E")


@dataclass
class Export:
    """What a job's artifact holds beyond the weights, metrics and config the skeleton writes."""

    files: dict[str, Any]  # file name -> IdMap or a JSON-able object
    data: dict[str, Any]  # the manifest's data section: source, sha256, counts
    namespace: str = ""  # the store's namespace (the data set's name)
    extra: dict[str, Any] = field(default_factory=dict)  # more manifest fields
    run_config: dict[str, Any] = field(default_factory=dict)  # more run_config.json fields


class JobClock:
    """The job's budget, counted from the end of data loading, the seconds of each phase and the
    process's peak RSS when each ended (the phase that raised it is the one whose figure grew)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.t0 = seconds, time.monotonic()
        self.phases: dict[str, float] = {}
        self.peak_gb: dict[str, float] = {}

    def left(self) -> float:
        return self.t0 + self.seconds - time.monotonic()

    def spent(self) -> float:
        return time.monotonic() - self.t0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - t0
            self.peak_gb[name] = peak_rss_gb()


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (Linux counts ru_maxrss in kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def warm_record(
    got: Carried, *, source: str, parent: Manifest, noun: str, old_ids: IdMap, new_ids: IdMap
) -> dict[str, Any]:
    """What a warm start carried (`got`, from the version `parent` at `source`), logged; -> the run
    config's record. `noun`: what the id map holds (items; a social model's users)."""
    log.info(
        "warm start from %s: %d tensors carried, %d %s kept, %d new%s",
        source,
        got.tensors,
        got.ids_kept,
        noun,
        got.ids_new,
        f"; fresh: {', '.join(got.fresh)}" if got.fresh else "",
    )
    return {
        "from": f"{parent.name}/{Path(source).name}",
        f"{noun}_kept": got.ids_kept,
        f"{noun}_new": got.ids_new,
        "fresh_tensors": got.fresh,
        # What the candidates first seen live are, as serving reads them (models/warm.py).
        FIRST_SEEN_LIVE: added_live(parent.config, old_ids, new_ids),
    }


# The share of the budget the phases after the training loop get when a job makes no estimate of its own.
AFTER_SHARE = 0.1


class Job(ABC, Generic[D, T, E]):
    """A training job of one task. Subclasses set the class attributes and fill the hooks."""

    task: ClassVar[str]
    data_config: ClassVar[type[Any]]
    train_config: ClassVar[type[Any]] = LoopConfig
    eval_config: ClassVar[type[Any]]
    key_metric: ClassVar[str] = "NDCG@10"  # the validation metric to maximise
    curve_keys: ClassVar[tuple[str, ...]] = ("NDCG@10", "HR@10")
    default_out: ClassVar[Path] = Path("artifacts")

    def __init__(
        self,
        cfg: RunConfig[D, T, E],
        *,
        out_root: Path | None = None,
        data_path: Path | None = None,
        dist: Dist | None = None,
        shared_data: Path | None = None,
        warm_from: Path | None = None,
        warm_gate: float = 0.0,
        cold_gate: float = 0.0,
    ) -> None:
        self.cfg = cfg
        self.warm_from = warm_from  # a version folder whose weights the model starts from
        # A warm version whose test figure against the best baseline is under this share of its parent's
        # is held back (models.artifact.HELD), never published: 0 publishes whatever it reaches.
        self.warm_gate = warm_gate
        # A cold version whose test figure is under this times its best baseline's is held back too when an
        # earlier version of its name is there to serve; the first is published, and the service says it
        # serves under its baseline (docs/decisions/cold-gate.md). 0: never held back.
        self.cold_gate = cold_gate
        self.out_root = out_root or self.default_out
        self.data_path = data_path
        self.shared_data = shared_data  # the ../shared/data folder, for data sets looked up by name
        self.dist = dist or Dist()
        self.device = resolve_device(cfg.train.device, self.dist.local_rank)
        self._untimed = 0.0
        self.history = History()
        self.clock = JobClock(cfg.train.max_minutes * 60)

    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> RunConfig[D, T, E]:
        return parse(raw, data=cls.data_config, train=cls.train_config, eval=cls.eval_config)

    # --- hooks -------------------------------------------------------------------------------------

    @abstractmethod
    def prepare_data(self) -> None:
        """Load the data and build the split (before the model: it sizes the vocabularies)."""

    @abstractmethod
    def build_model(self) -> nn.Module:
        """The model, from the run config and the data's vocabularies."""

    @abstractmethod
    def train_batches(self, model: nn.Module) -> Callable[[torch.Generator], Sequence[Any]]:
        """Per-epoch training batches: whatever the model's loss() takes."""

    def warm_start(self, model: nn.Module) -> dict[str, Any]:
        """Load what of the `warm_from` version's weights fits `model`; -> what was carried (for run_config)."""
        raise ValueError(f"the {self.task} task has no warm start")

    def preflight(self, model: nn.Module) -> None:
        """Checks on one real batch before training; raise with the name of the failed check."""

    def after_reserve(self, model: nn.Module) -> float:
        """Seconds of the budget kept for everything after the training loop (its last validation,
        after_training, evaluate, export): a job that can estimate them overrides this."""
        return AFTER_SHARE * self.clock.seconds

    def validates(self) -> bool:
        """Whether validate() has data; without it the lowest training loss chooses the epoch."""
        return True

    @abstractmethod
    def validate(self, model: nn.Module) -> dict[str, float]:
        """Validation metrics after an epoch, `key_metric` among them."""

    def after_training(self, model: nn.Module, history: History) -> None:
        """Anything between choosing the best epoch and the test evaluation (e.g. a refit)."""

    @abstractmethod
    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        """Test metrics and baselines, merged into metrics.json."""

    @abstractmethod
    def export(self, model: nn.Module) -> Export:
        """The artifact's own files and data description."""

    def data_file(self, configured: str) -> Path:
        """The data path: --data, else the config's `data.path`."""
        path = self.data_path or (Path(configured) if configured else None)
        if path is None:
            raise ValueError("no data: pass --data or set data.path")
        return path

    # --- the skeleton ------------------------------------------------------------------------------

    def held_back(self, metrics: dict[str, Any]) -> str | None:
        """Why this version must not be published, else None: a warm one whose figure against the best
        baseline is under `warm_gate` times its parent's; a cold one under `cold_gate` times the baseline's
        when an earlier version of its name is there to serve instead."""
        ours = vs_best_baseline(metrics)
        if self.warm_from is not None:
            parent = vs_best_baseline(read_manifest(self.warm_from).metrics)
            if not self.warm_gate or ours is None or parent is None or ours >= self.warm_gate * parent:
                return None
            return (
                f"test NDCG@10 {ours:.2f}x the best baseline, under {self.warm_gate:g} x the {parent:.2f}x of the"
                f" version it started from ({self.warm_from.name})"
            )
        if not self.cold_gate or ours is None or ours >= self.cold_gate:
            return None
        earlier = artifact.versions(self.out_root / self.cfg.name)
        if not earlier:
            log.warning(
                "test NDCG@10 %.2fx the best baseline, under %g: published all the same, as the first version of %s"
                " (the service serves it and says so in /readyz and seqserve_model_vs_best_baseline)",
                ours,
                self.cold_gate,
                self.cfg.name,
            )
            return None
        return f"test NDCG@10 {ours:.2f}x the best baseline, under {self.cold_gate:g}; {earlier[0].name} serves instead"

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """Time spent inside is evaluation, not training: kept out of train_seconds."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self._untimed += time.monotonic() - t0

    def run(self) -> Path | None:
        """Train, evaluate and export; returns the artifact folder (None on ranks other than 0)."""
        data_seconds = self._prepare()
        self.clock = JobClock(self.cfg.train.max_minutes * 60)  # the budget starts once the data is in
        self.clock.peak_gb["data"] = peak_rss_gb()
        model, warm = self._model()
        history, train_seconds = self._train(model)
        if not self.dist.is_main and not self.dist.own_data:
            return None
        metrics = self._evaluate(model, history, train_seconds=train_seconds)
        if not self.dist.is_main:  # its users scored, and its histories sent to rank 0 for the artifact
            self.export(model)
            return None
        return self._publish(model, history, metrics, warm=warm, data_seconds=data_seconds)

    def _prepare(self) -> float:
        """Threads, seed and the data; -> the data's seconds (outside the budget)."""
        t = self.cfg.train
        if t.reuse_freed_memory:
            reuse_freed_memory()
        if t.threads:
            torch.set_num_threads(t.threads)
        seed_everything(t.seed)
        t_data = time.monotonic()
        self.prepare_data()
        data_seconds = time.monotonic() - t_data
        log.info("data ready in %.1f s", data_seconds)
        return data_seconds

    def _model(self) -> tuple[nn.Module, dict[str, Any] | None]:
        """The model on its device, warm-started when the job continues a version; -> it and the warm start."""
        t = self.cfg.train
        model = self.build_model()
        warm = self.warm_start(model) if self.warm_from is not None else None
        model = model.to(self.device)
        seed_everything(t.seed + self.dist.rank)  # same initial weights everywhere; each rank its own sampling
        self.preflight(model)
        return model, warm

    def _train(self, model: nn.Module) -> tuple[History, float]:
        """The batches, the loop within what the budget leaves, what follows it; -> its history and the
        training seconds (validation's left out)."""
        t, clock = self.cfg.train, self.clock
        with clock.phase("before_training"):
            batches = self.train_batches(model)
            reserve = self.after_reserve(model)
        loop_seconds = max(clock.left() - reserve, 1e-3)  # at least one step
        log.info(
            "budget %.0f s: %.0f s spent before training, %.0f s for the loop, %.0f s kept for what follows it",
            clock.seconds,
            clock.spent(),
            loop_seconds,
            reserve,
        )
        t0 = time.monotonic()
        validate = self.validate if self.validates() else None
        self._untimed = 0.0
        log.info("training %s (%s) on %s", self.cfg.name, self.cfg.kind, self.device)
        with clock.phase("training_loop"):
            history = train(
                model,
                batches,
                dataclasses.replace(t, max_minutes=loop_seconds / 60),
                validate=validate,
                key_metric=self.key_metric,
                dist=self.dist,
                device=self.device,
            )
        self.history = history
        del batches  # the training windows: a refit builds its own
        with clock.phase("after_training"):
            self.after_training(model, history)
        return history, time.monotonic() - t0 - self._untimed

    def _evaluate(self, model: nn.Module, history: History, *, train_seconds: float) -> dict[str, Any]:
        """The run's metrics: the test figures, the training's and the history's."""
        metrics: dict[str, Any] = {
            "train_seconds": round(train_seconds, 1),
            "best_epoch": history.best_epoch,
            "epochs_run": len(history.epoch),
            "stopped": history.stopped,
            "ranks": self.dist.world,
            "device": str(self.device),
        }
        with self.clock.phase("evaluation"):
            metrics.update(self.evaluate(model))
        metrics["eval_seconds"] = round(self.clock.phases["evaluation"], 1)
        metrics["history"] = {
            "epoch": history.epoch,
            "loss": history.loss,
            "val": history.val,
            "seconds": history.seconds,
        }
        return metrics

    def _publish(
        self,
        model: nn.Module,
        history: History,
        metrics: dict[str, Any],
        *,
        warm: dict[str, Any] | None,
        data_seconds: float,
    ) -> Path:
        """The artifact's files, its manifest and its folder (aside when a warm retrain is held back)."""
        clock = self.clock
        out_root = self.out_root
        if (reason := self.held_back(metrics)) is not None:
            metrics["held_back"] = reason
            out_root = self.out_root / artifact.HELD
            log.error("%s held back, not published: %s", "warm retrain" if self.warm_from else "version", reason)
        with clock.phase("export_files"):
            pieces = self.export(model)
        # Each phase on its own clock. The budget (train.max_minutes) covers every one but the data;
        # writing the artifact's folder below is the only step after it.
        metrics["seconds"] = {
            "data": round(data_seconds, 1),
            **{name: round(v, 1) for name, v in clock.phases.items()},
            "after_data": round(clock.spent(), 1),
            "budget": round(clock.seconds, 3),
        }
        log.info("seconds: %s", " | ".join(f"{k} {v:g}" for k, v in metrics["seconds"].items()))
        metrics["peak_rss_gb"] = {name: round(v, 2) for name, v in clock.peak_gb.items()}
        log.info("peak RSS (GB) at the end of: %s", " | ".join(f"{k} {v:g}" for k, v in metrics["peak_rss_gb"].items()))
        run_config = self.cfg.to_dict()
        config = getattr(model, "config", None)
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            run_config["model"] = dataclasses.asdict(config)
        run_config.update(pieces.run_config)
        if warm is not None:
            run_config["warm_start"] = warm
        manifest = Manifest.new(
            name=self.cfg.name,
            kind=self.cfg.kind,
            task=self.task,
            namespace=pieces.namespace,
            data=pieces.data,
            config=run_config,
            metrics=metrics,
            extra=pieces.extra,
        )
        return export_artifact(
            out_root,
            manifest=manifest,
            model=model,
            files=pieces.files,
            history=history,
            curve_keys=self.curve_keys,
        )
