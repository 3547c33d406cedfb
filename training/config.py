"""Run configuration: a TOML file per model and dataset, plus `--set section.key=value` overrides."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass
class DataConfig:
    path: str = ""  # file or folder; empty = the default MovieLens-100k lookup
    item_table: str = ""  # optional item table (item, release time) for CSV/Parquet logs
    name: str = ""  # dataset label in the manifest
    previous_days: int = 7  # next-location protocol: history window in days
    min_history: int = 3  # next-location protocol: fewest history staypoints of a sample


@dataclass
class TrainConfig:
    epochs: int = 50
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    patience: int = 5  # epochs without a better validation NDCG@10 before stopping
    seed: int = 42
    max_minutes: float = 30.0  # wall-clock budget; stops after the epoch that crosses it
    full_data: bool = False  # train on every interaction (production model), no held-out split
    # After choosing the epoch on validation, train this many more epochs with the validation
    # items added (everything but the test item, as in the BERT4Rec paper's protocol).
    refit_epochs: int = 0
    # Evaluation protocol: "popularity" or "uniform" sampled negatives, or "full" ranking.
    eval_negatives: str = "full"
    n_eval_negatives: int = 100
    exclude_seen: bool = True  # full ranking: remove the user's earlier items from the candidates
    val_users: int = 0  # validate each epoch on this many users (0 = all), for speed
    eval_batch_size: int = 512
    threads: int = 0  # torch threads; 0 = torch's default
    clip_grad_norm: float = 0.0  # 0 = no clipping
    # Next-location: train on "a place the person had not visited before this history window"
    # as the unknown class, the way unseen places look at serving time.
    novel_as_unknown: bool = False


@dataclass
class RunConfig:
    kind: str
    model: dict[str, Any]
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = ""  # artifact name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        node = node.setdefault(p, {})
    node[parts[-1]] = _parse_value(value.strip())


def _section(cls: type, values: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)} in [{where}]; known: {sorted(known)}")
    return cls(**values)


def load_config(path: Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    raw: dict[str, Any] = tomllib.loads(path.read_text()) if path else {}
    for o in overrides:
        apply_override(raw, o)
    model = dict(raw.get("model", {}))
    kind = model.pop("kind", None)
    if not kind:
        raise ValueError("the config needs model.kind")
    return RunConfig(
        kind=kind,
        model=model,
        data=_section(DataConfig, raw.get("data", {}), "data"),
        train=_section(TrainConfig, raw.get("train", {}), "train"),
        name=str(raw.get("name", kind)),
    )
