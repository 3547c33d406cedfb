"""A toy task with every piece a task has, in one module and nowhere else: a model kind, a training
job, an artifact loader and served engine, and a route. Its model learns which token follows which
in a cycle (token i -> i + 1 mod n). tests/models/test_task_table.py registers it (`register_all`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field
from torch import nn

from app.limits import Limits
from app.routers.tasks import ROUTES, TaskRoute, register_route
from app.schemas import Body
from models import artifact
from models.engine import Engine, EngineOptions
from models.kinds import build
from models.manifest import Manifest
from models.queries import QueryError, Timeline
from models.tasks import Task, register
from training.config import LoopConfig
from training.job import Export, Job
from training.jobs import JOBS, DefaultRun, TaskJob, register_job

NAME = "toy"


@dataclass
class ToyConfig:
    n_tokens: int
    d_model: int = 8


class ToyModel(nn.Module):
    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.config = config
        self.emb = nn.Embedding(config.n_tokens, config.d_model)
        self.out = nn.Linear(config.d_model, config.n_tokens)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B,) tokens -> (B, n_tokens) scores of the next token."""
        return self.out(self.emb(tokens))

    def loss(self, pairs: torch.Tensor) -> torch.Tensor:
        """(B, 2) (token, next token) -> scalar."""
        return nn.functional.cross_entropy(self(pairs[:, 0]), pairs[:, 1])


# --- the training job -------------------------------------------------------------------------------


@dataclass
class ToyData:
    n_tokens: int = 12


@dataclass
class ToyEval:
    pass


class ToyJob(Job[ToyData, LoopConfig, ToyEval]):
    task = NAME
    data_config = ToyData
    eval_config = ToyEval
    key_metric = "acc"
    curve_keys = ("acc",)

    def prepare_data(self) -> None:
        n = self.cfg.data.n_tokens
        self.pairs = torch.tensor([[i, (i + 1) % n] for i in range(n)])

    def build_model(self) -> nn.Module:
        return build(self.cfg.kind, {"n_tokens": self.cfg.data.n_tokens, **self.cfg.model})

    def train_batches(self, model: nn.Module) -> Callable[[torch.Generator], Sequence[Any]]:
        return lambda gen: [self.pairs[torch.randperm(len(self.pairs), generator=gen)]]

    def validate(self, model: nn.Module) -> dict[str, float]:
        with torch.inference_mode():
            guess = model(self.pairs[:, 0].to(self.device)).argmax(1).cpu()
        return {"acc": float((guess == self.pairs[:, 1]).float().mean())}

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        return {"test": self.validate(model)}

    def export(self, model: nn.Module) -> Export:
        return Export(files={}, data={"source": "generated", "sha256": "", "tokens": self.cfg.data.n_tokens})


# --- the artifact and the served engine -------------------------------------------------------------


@dataclass
class ToyArtifact:
    manifest: Manifest
    model: ToyModel


def load_artifact(folder: Path, map_location: str | torch.device = "cpu") -> ToyArtifact:
    manifest = artifact.read_manifest(folder)
    return ToyArtifact(manifest, artifact.read_model(folder, manifest, ToyModel, map_location))


@dataclass
class ToyQuery:
    token: int
    k: int


class ToyEngine(Engine[ToyQuery, ToyQuery, list[int]]):
    def __init__(self, art: ToyArtifact, options: EngineOptions) -> None:
        self.manifest, self.device = art.manifest, options.device
        self.model = art.model.to(self.device).eval()

    @property
    def catalog_size(self) -> int:
        return self.model.config.n_tokens

    def prepare(self, queries: Sequence[ToyQuery], live: Mapping[str, Timeline]) -> list[ToyQuery]:
        for n, q in enumerate(queries):
            if q.token >= self.catalog_size:
                raise QueryError(f"token {q.token} is not in the cycle", position=n, field=("token",))
        return list(queries)

    def run(self, batch: list[ToyQuery]) -> torch.Tensor:
        return self.model(torch.tensor([q.token for q in batch], device=self.device))

    def results(self, batch: list[ToyQuery], output: Any) -> list[list[int]]:
        top = output.topk(max(q.k for q in batch), dim=1).indices.cpu().tolist()
        return [row[: q.k] for row, q in zip(top, batch, strict=True)]

    def warm_up(self) -> None:
        self.answer([ToyQuery(0, 1)])


# --- the route --------------------------------------------------------------------------------------


class ToyQueryIn(BaseModel):
    token: int = Field(ge=0)
    k: int = Field(1, ge=1)


class ToyRequest(BaseModel):
    model: str | None = None
    queries: list[ToyQueryIn] = Field(min_length=1)


class ToyResponse(BaseModel):
    model: str
    version: str
    results: list[dict[str, list[int]]]


def toy_body(limits: Limits) -> Body:
    return Body(ToyRequest, {"queries": limits.max_queries})


ROUTE = TaskRoute(
    name=NAME,
    path="/toy",
    tag="toy",
    summary="The tokens most likely to follow each given token.",
    body=toy_body,
    response=ToyResponse,
    queries=lambda body: [ToyQuery(q.token, q.k) for q in body.queries],
    result=lambda r: {"next": r},
)

TASK = Task(NAME, {"toy": (ToyConfig, ToyModel)}, route=NAME, load=load_artifact, engine=ToyEngine)


def register_all(*defaults: DefaultRun) -> None:
    """The toy task's three pieces, each registered with the package that owns its kind: the row in the
    task table, the job with training, the route with the service."""
    register(TASK)
    register_job(TaskJob(ToyJob, command="toy-task", defaults=defaults))
    register_route(ROUTE)


def unregister_all() -> None:
    JOBS.pop(NAME, None)
    ROUTES.pop(NAME, None)
