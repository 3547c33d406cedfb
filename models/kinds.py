"""MODEL_KINDS: each model kind's (config dataclass, module class), filled by the task table
(models.tasks.register: each task's row lists its model kinds). Read it through `registered()`, which
imports the table at first use: importing a module of models/ never imports every model (and torch) by
itself, so the history store, the settings and a multi-worker server's parent stay torch-free."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from models.base import SequentialRecommender

MODEL_KINDS: dict[str, tuple[type[Any], type[nn.Module]]] = {}


def registered() -> dict[str, tuple[type[Any], type[nn.Module]]]:
    """MODEL_KINDS with every row of the task table in it."""
    import models.tasks  # noqa: F401  (its rows fill MODEL_KINDS; imported here, not at the top: a cycle)

    return MODEL_KINDS


def build(kind: str, config: dict[str, Any]) -> nn.Module:
    """Construct a model from its kind and config mapping alone."""
    kinds = registered()
    if kind not in kinds:
        raise KeyError(f"unknown model kind {kind!r}; known: {sorted(kinds)}")
    config_cls, model_cls = kinds[kind]
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
