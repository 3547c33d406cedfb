"""The task table: every kind of work the project trains and serves, and where its pieces are.

A task is one shape: an artifact loader and a served engine here in models/, a training job in
training/jobs/ (named by its module path, so that models/ imports neither side), and the route that
serves it. Adding a task means adding its pieces and one row below, not editing a dispatcher.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.serving import Engine, EngineOptions
from models.tasks import next_location, recommend, social


@dataclass(frozen=True)
class Task:
    name: str
    kinds: tuple[str, ...]  # model kinds (models.registry) trained and served for this task
    job: str  # module path of its training job (training/jobs/<task>.py, exporting JOB)
    route: str | None = None  # the endpoint family that serves it; None = trained, not served
    load: Callable[[Path, str | torch.device], Any] | None = None  # version folder -> artifact
    engine: Callable[[Any, EngineOptions], Engine[Any, Any, Any]] | None = None  # artifact -> engine

    def open(self, folder: Path, options: EngineOptions) -> Engine[Any, Any, Any]:
        """Load a version folder and place it on a device, ready to serve."""
        if self.load is None or self.engine is None:
            raise ValueError(f"task {self.name!r} is not served")
        return self.engine(self.load(folder, "cpu"), options)


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "recommend",
            ("sasrec", "bert4rec"),
            "training.jobs.recommend",
            route="recommend",
            load=recommend.load_artifact,
            engine=recommend.RecEngine,
        ),
        Task(
            "next_location",
            ("mhsa",),
            "training.jobs.next_location",
            route="next_location",
            load=next_location.load_artifact,
            engine=next_location.LocEngine,
        ),
        Task(
            "social",
            ("social",),
            "training.jobs.social",
            route="recommend",
            load=social.load_artifact,
            engine=social.SocialEngine,
        ),
        Task("copy", ("seq2seq",), "training.jobs.copy"),  # proves the attention blocks; trained, not served
    )
}


def task_of_kind(kind: str) -> Task:
    for t in TASKS.values():
        if kind in t.kinds:
            return t
    known = sorted(k for t in TASKS.values() for k in t.kinds)
    raise ValueError(f"no task trains model kind {kind!r}; known kinds: {known}")
