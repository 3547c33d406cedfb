"""Run configuration: a TOML file per model and data set, plus `--set section.key=value` overrides.

Sections: `name`, `[model]` (kind + the model's config dataclass fields), `[train]` (the loop: shared
by every job, extended by a task's own knobs), `[data]` and `[eval]` (the task's own dataclasses).
Each job declares its section classes; an unknown key anywhere is an error naming the section.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Generic, TypeVar

D = TypeVar("D")
T = TypeVar("T", bound="LoopConfig")
E = TypeVar("E")

DEVICES = "auto | cpu | cuda | cuda:N"
PRECISIONS = ("auto", "fp32", "bf16")
SCHEDULES = ("constant", "cosine")


@dataclass
class LoopConfig:
    """[train]: the training loop every job shares."""

    epochs: int = 50
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    patience: int = 5  # epochs without a better validation score before stopping
    seed: int = 42
    max_minutes: float = 30.0  # wall-clock budget of the training loop: a deadline, checked inside epochs too
    threads: int = 0  # torch threads; 0 = torch's default
    device: str = "auto"  # auto = CUDA when available, else CPU
    precision: str = "auto"  # auto = bf16 autocast on CUDA, fp32 on the CPU (where bf16 matmuls are slower)
    clip_grad_norm: float = 0.0  # 0 = no clipping
    warmup_steps: int = 0  # linear warm-up of the learning rate from 0
    # or "cosine": decay to 0 at `epochs` epochs or at the end of `max_minutes`, whichever is first
    schedule: str = "constant"
    # > 0: validate, keep and export an exponential moving average of the weights over about this many
    # recent epochs instead of the last step's (docs/decisions/weight-averaging.md); 0 = off
    ema_epochs: float = 0.0
    # serve large tensors from the heap and keep freed memory (glibc): a step's big blocks stop being
    # page-faulted in afresh each time (docs/decisions/reuse-freed-memory.md)
    reuse_freed_memory: bool = True

    def __post_init__(self) -> None:
        if not self.max_minutes > 0:  # the whole job's budget: a negative or zero one is a typo
            raise ValueError(f"train.max_minutes must be > 0, got {self.max_minutes}")
        if self.ema_epochs < 0:
            raise ValueError(f"train.ema_epochs must be >= 0, got {self.ema_epochs}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"train.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        dev = self.device
        if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise ValueError(f"train.device must be {DEVICES}, got {dev!r}")


@dataclass
class RunConfig(Generic[D, T, E]):
    kind: str
    model: dict[str, Any]
    data: D
    train: T
    eval: E
    name: str = ""  # artifact name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Empty:
    """A section a task does not use."""


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare string


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply `section.key=value` (value in TOML syntax, or a bare string) to a raw config dict."""
    if "=" not in assignment:
        raise ValueError(f"override {assignment!r} is not of the form section.key=value")
    key, value = assignment.split("=", 1)
    parts = key.strip().split(".")
    node = raw
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ValueError(f"override {assignment!r}: {p!r} is not a section")
        node = child
    node[parts[-1]] = _parse_value(value.strip())


def read_raw(path: Path | None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The TOML file (or nothing) with the overrides applied."""
    raw: dict[str, Any] = tomllib.loads(path.read_text()) if path else {}
    for o in overrides:
        apply_override(raw, o)
    return raw


def kind_of(raw: dict[str, Any]) -> str:
    model = raw.get("model")
    kind = model.get("kind") if isinstance(model, dict) else None
    if not kind or not isinstance(kind, str):
        raise ValueError("the config needs model.kind")
    return kind


def section(cls: type[Any], values: Any, where: str) -> Any:
    """Build a section dataclass, naming the section for an unknown key or a wrong shape."""
    if not isinstance(values, dict):
        raise ValueError(f"[{where}] must be a table")
    known = {f.name for f in fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)} in [{where}]; known: {sorted(known)}")
    try:
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"[{where}]: {exc}") from None


def parse(raw: dict[str, Any], *, data: type[D], train: type[T], eval: type[E]) -> RunConfig[D, T, E]:
    unknown = set(raw) - {"name", "model", "data", "train", "eval"}
    if unknown:
        raise ValueError(f"unknown section(s) {sorted(unknown)}; known: name, model, data, train, eval")
    model = dict(raw.get("model", {}))
    kind = kind_of(raw)
    model.pop("kind")
    return RunConfig(
        kind=kind,
        model=model,
        name=str(raw.get("name", kind)),
        data=section(data, raw.get("data", {}), "data"),
        train=section(train, raw.get("train", {}), "train"),
        eval=section(eval, raw.get("eval", {}), "eval"),
    )
