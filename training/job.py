"""One skeleton for every training job; each task fills in its data, model, metrics and artifact.

    run():  threads, seed, device (and the distributed set-up) -> prepare_data -> build_model
            -> preflight -> the training loop (best checkpoint by validation) -> after_training
            -> evaluate (test metrics, baselines) -> export (the artifact folder, one per run)

Only rank 0 of a torchrun job evaluates and exports. Time spent evaluating inside the hooks is kept
out of `train_seconds` by wrapping it in `self.untimed()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import nn

from models.manifest import Manifest
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
    namespace: str = ""  # the history store's namespace (the data set's name)
    extra: dict[str, Any] = field(default_factory=dict)  # more manifest fields
    run_config: dict[str, Any] = field(default_factory=dict)  # more run_config.json fields


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
    ) -> None:
        self.cfg = cfg
        self.warm_from = warm_from  # a version folder whose weights the model starts from
        self.out_root = out_root or self.default_out
        self.data_path = data_path
        self.shared_data = shared_data  # the ../shared/data folder, for data sets looked up by name
        self.dist = dist or Dist()
        self.device = resolve_device(cfg.train.device, self.dist.local_rank)
        self._untimed = 0.0
        self.history = History()

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
        model = self.build_model()
        warm = self.warm_start(model) if self.warm_from is not None else None
        model = model.to(self.device)
        seed_everything(t.seed + self.dist.rank)  # same initial weights everywhere; each rank its own sampling
        self.preflight(model)
        t0 = time.monotonic()
        validate = self.validate if self.validates() else None
        self._untimed = 0.0
        log.info("training %s (%s) on %s", self.cfg.name, self.cfg.kind, self.device)
        history = train(
            model,
            self.train_batches(model),
            t,
            validate=validate,
            key_metric=self.key_metric,
            dist=self.dist,
            device=self.device,
        )
        self.history = history
        loop_seconds = time.monotonic() - t0
        self.after_training(model, history)
        after_seconds = time.monotonic() - t0 - loop_seconds
        train_seconds = time.monotonic() - t0 - self._untimed
        if not self.dist.is_main:
            return None
        t1 = time.monotonic()
        metrics: dict[str, Any] = {
            "train_seconds": round(train_seconds, 1),
            "best_epoch": history.best_epoch,
            "epochs_run": len(history.epoch),
            "stopped": history.stopped,
            "ranks": self.dist.world,
            "device": str(self.device),
        }
        metrics.update(self.evaluate(model))
        metrics["eval_seconds"] = round(time.monotonic() - t1, 1)
        metrics["history"] = {
            "epoch": history.epoch,
            "loss": history.loss,
            "val": history.val,
            "seconds": history.seconds,
        }
        t2 = time.monotonic()
        pieces = self.export(model)
        # Each phase on its own clock: train.max_minutes bounds the training loop only.
        metrics["seconds"] = {
            "data": round(data_seconds, 1),
            "training_loop": round(loop_seconds, 1),
            "after_training": round(after_seconds, 1),
            "evaluation": metrics["eval_seconds"],
            "export_files": round(time.monotonic() - t2, 1),
            "budget": t.max_minutes * 60,
        }
        log.info("seconds: %s", " | ".join(f"{k} {v:g}" for k, v in metrics["seconds"].items()))
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
            self.out_root,
            manifest=manifest,
            model=model,
            files=pieces.files,
            history=history,
            curve_keys=self.curve_keys,
        )
