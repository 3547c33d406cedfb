"""The task table: every kind of work the project trains and serves, and what both sides share.

A task is one registered row (`register`, docs/decisions/task-table.md): its model kinds, its
artifact loader and served engine, and the name of the route that serves it. Each side registers its
own piece under the task's name, in the package that owns it: the training job (training/jobs/) and
the route (app/routers/); models/ names neither. The model kinds (MODEL_KINDS), the training CLI, the
service's routes, request bodies, OpenAPI document and defaults, and batch prediction are all derived
from the rows; adding a task adds its pieces and one row on each side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models import artifact
from models.bert4rec import BERT4Rec, BERT4RecConfig
from models.engine import Engine, EngineOptions
from models.kinds import MODEL_KINDS
from models.mhsa import MHSA, MHSAConfig
from models.sasrec import SASRec, SASRecConfig
from models.seq2seq import Seq2Seq, Seq2SeqConfig
from models.social import SocialConfig, SocialModel
from models.tasks import next_location, recommend, social


@dataclass(frozen=True)
class Task:
    name: str
    models: Mapping[str, tuple[type[Any], type[nn.Module]]]  # model kind -> (config dataclass, module)
    # The name of the endpoint family that serves it (the service registers each route under its name;
    # several tasks may share one); None = trained, not served.
    route: str | None = None
    load: Callable[[Path, str | torch.device], Any] | None = None  # version folder -> artifact
    engine: Callable[[Any, EngineOptions], Engine[Any, Any, Any]] | None = None  # artifact -> engine
    ranks: str = "items"  # what its models rank, in words (GET /models, the console's labels)
    # The artifact file of the id map of what its models rank, for a task whose job retrains warm (the
    # retrainer reads which ids live events name that a version does not know); None: no warm retrain.
    warm_ids: str | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.models)

    def open(self, folder: Path, options: EngineOptions) -> Engine[Any, Any, Any]:
        """Load a version folder and place it on a device, ready to serve."""
        if self.load is None or self.engine is None:
            raise ValueError(f"task {self.name!r} is not served")
        return self.engine(self.load(folder, "cpu"), options)


TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Add a task's row, and its model kinds to models.kinds.MODEL_KINDS."""
    if task.name in TASKS:
        raise ValueError(f"task {task.name!r} is registered already")
    taken = sorted(set(task.models) & set(MODEL_KINDS))
    if taken:
        raise ValueError(f"model kind(s) {taken} belong to another task")
    if (task.route is None) != (task.engine is None):
        raise ValueError(f"task {task.name!r}: a route needs an engine, and an engine a route")
    TASKS[task.name] = task
    MODEL_KINDS.update(task.models)
    return task


def task_of_kind(kind: str) -> Task:
    for t in TASKS.values():
        if kind in t.models:
            return t
    known = sorted(k for t in TASKS.values() for k in t.models)
    raise ValueError(f"no task trains model kind {kind!r}; known kinds: {known}")


register(
    Task(
        "recommend",
        {"sasrec": (SASRecConfig, SASRec), "bert4rec": (BERT4RecConfig, BERT4Rec)},
        route="recommend",
        load=recommend.load_artifact,
        engine=recommend.RecEngine,
        warm_ids=artifact.ITEMS,
    )
)
register(
    Task(
        "next_location",
        {"mhsa": (MHSAConfig, MHSA)},
        route="next_location",
        ranks="locations",
        load=next_location.load_artifact,
        engine=next_location.LocEngine,
    )
)
register(
    Task(
        "social",
        {"social": (SocialConfig, SocialModel)},
        route="recommend",
        load=social.load_artifact,
        engine=social.SocialEngine,
        ranks="users",
        warm_ids=artifact.USERS,
    )
)
# Proves the attention blocks; trained, not served.
register(Task("copy", {"seq2seq": (Seq2SeqConfig, Seq2Seq)}))
