"""Self-describing checkpoints: {kind, format_version, config, state_dict}, loaded weights-only."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.kinds import MODEL_KINDS, build

FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """The file is not a checkpoint this code can load. `problem` names what is wrong without the path."""

    def __init__(self, path: Path | str, problem: str, detail: str = "") -> None:
        super().__init__(f"{path}: {problem}" + (f" ({detail})" if detail else ""))
        self.problem = problem


def save_checkpoint(path: Path, kind: str, model: nn.Module) -> None:
    config = getattr(model, "config", None)
    if kind not in MODEL_KINDS or not dataclasses.is_dataclass(config):
        raise CheckpointError(path, f"cannot save model of kind {kind!r}")
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


def upgrade_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights saved before every model shared models.layers.EncoderLayer, renamed to its layout.

    - torch's nn.TransformerEncoderLayer (SASRec, BERT4Rec, MHSA): `self_attn.in_proj_weight` /
      `_bias` -> `attn.in_proj.*`, `self_attn.out_proj.*` -> `attn.out.*`, `linear1.*` -> `ff.0.*`,
      `linear2.*` -> `ff.3.*`; the norms keep their names.
    - separate query, key and value projections (social model, seq2seq): `<attn>.q.*`, `.k.*`, `.v.*`
      -> one `<attn>.in_proj.*`, stacked in that order.
    The values are the same tensors; a state already in today's layout is returned as it is.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for old, new in (
            (".self_attn.in_proj_weight", ".attn.in_proj.weight"),
            (".self_attn.in_proj_bias", ".attn.in_proj.bias"),
            (".self_attn.out_proj.", ".attn.out."),
            (".linear1.", ".ff.0."),
            (".linear2.", ".ff.3."),
        ):
            if old in key:
                key = key.replace(old, new)
        out[key] = value
    for key in [k for k in out if k.endswith((".q.weight", ".q.bias"))]:
        base, leaf = key.rsplit(".q.", 1)
        parts = [f"{base}.{x}.{leaf}" for x in "qkv"]
        if all(p in out for p in parts):
            out[f"{base}.in_proj.{leaf}"] = torch.cat([out.pop(p) for p in parts])
    return out


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> tuple[str, nn.Module]:
    """Rebuild the model a checkpoint describes; never unpickles arbitrary objects."""
    try:
        obj: Any = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # corrupt file, truncated write, not a torch file
        raise CheckpointError(path, "unreadable checkpoint", f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, dict) or not {"kind", "format_version", "config", "state_dict"} <= obj.keys():
        raise CheckpointError(path, "missing kind/format_version/config/state_dict")
    if obj["format_version"] != FORMAT_VERSION:
        raise CheckpointError(path, f"format version {obj['format_version']!r}, expected {FORMAT_VERSION}")
    kind, config, state = obj["kind"], obj["config"], obj["state_dict"]
    if not isinstance(kind, str) or not isinstance(config, dict) or not isinstance(state, dict):
        raise CheckpointError(path, "kind must be a string, config and state_dict tables")
    try:
        model = build(kind, config)
        model.load_state_dict(upgrade_state(state))
    except Exception as exc:  # an untrusted file: any way it fails to build is a defect of the file
        # The message names config keys or tensor shapes, never a path.
        raise CheckpointError(path, f"does not build: {str(exc).splitlines()[0][:300]}") from exc
    return kind, model
