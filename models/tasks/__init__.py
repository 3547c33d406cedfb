"""The task table: every kind of work the project trains and serves, and where its pieces are.

A task is one registered row (`register`, docs/decisions/task-table.md): its model kinds, its
artifact loader and served engine here in models/, its training job and the service's route named
by module path (training/jobs/, app/routers/: models/ imports neither side), and the runs that train
its default models. The model kinds (MODEL_KINDS), the training CLI, the service's routes, request bodies,
OpenAPI document and defaults, and batch prediction are all derived from the rows; adding a task
adds its pieces and one row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
class Route:
    """An endpoint family of the service: its name, and the module that defines it (exporting ROUTE,
    an app.routers.tasks.TaskRoute). Several tasks may be served by one route."""

    name: str
    module: str


@dataclass(frozen=True)
class DefaultRun:
    """A model trained when the artifacts folder is empty (`python -m training defaults`)."""

    config: str  # run config, relative to the repository
    data_env: str  # environment variable naming the data; unset: the config's own data.path
    overrides: tuple[str, ...] = ()  # SECTION.KEY=VALUE, as --set takes them
    what: str = ""  # one line for the log


@dataclass(frozen=True)
class Task:
    name: str
    models: Mapping[str, tuple[type[Any], type[nn.Module]]]  # model kind -> (config dataclass, module)
    job: str  # module path of its training job (exporting JOB)
    route: Route | None = None  # the endpoint family that serves it; None = trained, not served
    load: Callable[[Path, str | torch.device], Any] | None = None  # version folder -> artifact
    engine: Callable[[Any, EngineOptions], Engine[Any, Any, Any]] | None = None  # artifact -> engine
    command: str | None = None  # a CLI command of its own (`python -m training <command>`), run with `config`
    config: str | None = None  # that command's default run config, relative to the repository
    defaults: tuple[DefaultRun, ...] = field(default=())
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


RECOMMEND = Route("recommend", "app.routers.recommend")

register(
    Task(
        "recommend",
        {"sasrec": (SASRecConfig, SASRec), "bert4rec": (BERT4RecConfig, BERT4Rec)},
        "training.jobs.recommend",
        route=RECOMMEND,
        load=recommend.load_artifact,
        engine=recommend.RecEngine,
        warm_ids=artifact.ITEMS,
        defaults=(
            DefaultRun(
                "training/configs/sasrec_ml100k.toml", "SEQSERVE_DATA", what="the default SASRec on MovieLens-100k"
            ),
        ),
    )
)
register(
    Task(
        "next_location",
        {"mhsa": (MHSAConfig, MHSA)},
        "training.jobs.next_location",
        route=Route("next_location", "app.routers.next_location"),
        ranks="locations",
        load=next_location.load_artifact,
        engine=next_location.LocEngine,
        defaults=(
            DefaultRun(
                "training/configs/mhsa_geolife.toml",
                "SEQSERVE_GEOLIFE",
                ("train.max_minutes=1.0",),
                what="a quick next-location model on GeoLife (1-minute budget)",
            ),
        ),
    )
)
register(
    Task(
        "social",
        {"social": (SocialConfig, SocialModel)},
        "training.jobs.social",
        route=RECOMMEND,
        load=social.load_artifact,
        engine=social.SocialEngine,
        ranks="users",
        warm_ids=artifact.USERS,
        defaults=(
            DefaultRun(
                "training/configs/social_mathoverflow.toml",
                "SEQSERVE_SOCIAL",
                (
                    "name='social-mathoverflow-quick'",
                    "data.recent_examples=50000",
                    "train.epochs=1",
                    "train.refit_epochs=0",
                    "eval.baselines=false",
                ),
                what="a quick social model on MathOverflow (about 2 minutes)",
            ),
        ),
    )
)
# Proves the attention blocks; trained, not served.
register(
    Task(
        "copy",
        {"seq2seq": (Seq2SeqConfig, Seq2Seq)},
        "training.jobs.copy",
        command="copy-task",
        config="training/configs/copy_task.toml",
    )
)
