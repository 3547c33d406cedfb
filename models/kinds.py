"""MODEL_KINDS: each model kind's (config dataclass, module class), filled by the task table
(models.tasks.register: each task's row lists its model kinds) when a program imports the table: the
service (app/loaded.py), training (training/jobs/), a bench, the tests' conftest. Importing a module of
models/ does not import the table, so the history store, the settings and a multi-worker server's parent
never load every model and torch."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from models.base import SequentialRecommender

MODEL_KINDS: dict[str, tuple[type[Any], type[nn.Module]]] = {}


def build(kind: str, config: dict[str, Any]) -> nn.Module:
    """Construct a model from its kind and config mapping alone."""
    if kind not in MODEL_KINDS:
        loaded = "" if MODEL_KINDS else " (no task table loaded: the program imports models.tasks)"
        raise KeyError(f"unknown model kind {kind!r}; known: {sorted(MODEL_KINDS)}{loaded}")
    config_cls, model_cls = MODEL_KINDS[kind]
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = set(config) - known
    if unknown:
        raise ValueError(f"unknown {kind} config key(s) {sorted(unknown)}; known: {sorted(known)}")
    return model_cls(config_cls(**config))


def build_recommender(kind: str, config: dict[str, Any]) -> SequentialRecommender:
    model = build(kind, config)
    if not isinstance(model, SequentialRecommender):
        raise TypeError(f"model kind {kind!r} is not a sequential recommender")
    return model
