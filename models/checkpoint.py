"""Self-describing checkpoints: {kind, format_version, config, state_dict}, loaded weights-only."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.registry import REGISTRY, build

FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """The file is not a checkpoint this code can load."""


def save_checkpoint(path: Path, kind: str, model: nn.Module) -> None:
    config = getattr(model, "config", None)
    if kind not in REGISTRY or not dataclasses.is_dataclass(config):
        raise CheckpointError(f"cannot save model of kind {kind!r}")
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save(
        {
            "kind": kind,
            "format_version": FORMAT_VERSION,
            "config": dataclasses.asdict(config),  # type: ignore[arg-type]
            "state_dict": state,
        },
        path,
    )


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> tuple[str, nn.Module]:
    """Rebuild the model a checkpoint describes; never unpickles arbitrary objects."""
    try:
        obj: Any = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # corrupt file, truncated write, not a torch file
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc.__class__.__name__}: {exc})") from exc
    if not isinstance(obj, dict) or not {"kind", "format_version", "config", "state_dict"} <= obj.keys():
        raise CheckpointError(f"{path}: missing kind/format_version/config/state_dict")
    if obj["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format version {obj['format_version']}, expected {FORMAT_VERSION}")
    kind = obj["kind"]
    try:
        model = build(kind, obj["config"])
        model.load_state_dict(obj["state_dict"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    return kind, model
