"""The typed manifest of an artifact version: what it is, what it was trained on, how it scored."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from models.checkpoint import FORMAT_VERSION


class ManifestError(ValueError):
    """A manifest that is missing a field or holds one of the wrong type."""


def _field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if key not in obj:
        if default is ...:
            raise ManifestError(f"missing field {key!r}")
        return default
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ManifestError(f"field {key!r} must be {want}, not {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Manifest:
    name: str  # the artifact's name: its folder under the artifacts root
    kind: str  # model kind (models.kinds.MODEL_KINDS)
    task: str  # models.tasks.TASKS
    version: str  # UTC time of the run, e.g. 20261122T111403Z
    created_at: str = ""
    format_version: int = FORMAT_VERSION
    # The history store's namespace: the data set's name, shared by every model trained on it.
    namespace: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # source, sha256 and counts
    config: dict[str, Any] = field(default_factory=dict)  # the full run config
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # task-specific, e.g. next-location's bucketing

    @property
    def data_hash(self) -> str:
        """Identifies the training data (and so the histories an artifact carries)."""
        return str(self.data.get("sha256") or self.version)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "task": self.task,
            "format_version": self.format_version,
            "version": self.version,
            "created_at": self.created_at,
            "namespace": self.namespace,
            "data": self.data,
            "config": self.config,
            "metrics": self.metrics,
            **self.extra,
        }

    @classmethod
    def from_json(cls, obj: object) -> Manifest:
        """Parse and type-check a manifest document; raises ManifestError naming the field."""
        if not isinstance(obj, dict):
            raise ManifestError(f"must be a JSON object, not {type(obj).__name__}")
        known = {
            "name",
            "kind",
            "task",
            "format_version",
            "version",
            "created_at",
            "namespace",
            "data",
            "config",
            "metrics",
        }
        config = _field(obj, "config", dict, {})
        name = _field(obj, "name", str, "")
        data_cfg = config.get("data")
        # Manifests written before the namespace field: the data set's name, else the model's.
        fallback = str(data_cfg.get("name") or "") if isinstance(data_cfg, dict) else ""
        return cls(
            name=name,
            kind=_field(obj, "kind", str),
            task=_field(obj, "task", str, "recommend"),
            version=str(_field(obj, "version", (str, int))),
            created_at=_field(obj, "created_at", str, ""),
            format_version=_field(obj, "format_version", int, FORMAT_VERSION),
            namespace=_field(obj, "namespace", str, "") or fallback or name,
            data=_field(obj, "data", dict, {}),
            config=config,
            metrics=_field(obj, "metrics", dict, {}),
            extra={k: v for k, v in obj.items() if k not in known},
        )

    @classmethod
    def new(
        cls,
        *,
        name: str,
        kind: str,
        task: str,
        namespace: str,
        data: dict[str, Any],
        config: dict[str, Any],
        metrics: dict[str, Any],
        extra: dict[str, Any] | None = None,
    ) -> Manifest:
        """A manifest for a run finishing now."""
        now = dt.datetime.now(dt.UTC)
        return cls(
            name=name,
            kind=kind,
            task=task,
            version=now.strftime("%Y%m%dT%H%M%SZ"),
            created_at=now.isoformat(),
            namespace=namespace or name,
            data=data,
            config=config,
            metrics=metrics,
            extra=extra or {},
        )
