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
    # The store's namespace: the data set's name, shared by every model trained on it.
    namespace: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # source, sha256 and counts
    config: dict[str, Any] = field(default_factory=dict)  # the full run config
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # task-specific, e.g. next-location's bucketing

    @property
    def created(self) -> float | None:
        """When the run that wrote it finished (unix seconds, from created_at); None when it does not say. A
        version's age is read here, never from its folder's name, which a copy or a rename can carry."""
        try:
            when = dt.datetime.fromisoformat(self.created_at)
        except ValueError:
            return None
        return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()

    @property
    def test_ndcg10(self) -> float | None:
        """The offline test NDCG@10 the job measured over every candidate ("full"; a social job's "all"), if any."""
        found = self.metrics.get("test")
        for protocol in ("full", "all"):
            part = found.get(protocol) if isinstance(found, dict) else None
            value = part.get("NDCG@10") if isinstance(part, dict) else None
            if isinstance(value, int | float):
                return float(value)
        return None

    @property
    def vs_best_baseline(self) -> float | None:
        """The test figure over the best simple baseline's of the same run (vs_best_baseline)."""
        return vs_best_baseline(self.metrics)

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


def vs_best_baseline(metrics: dict[str, Any]) -> float | None:
    """The test figure as a ratio to the best baseline of the same run (a task's own ratio where it
    writes one, else NDCG@10 of the whole test set), None where the run has no baselines."""
    if "full_ndcg10_vs_best_baseline" in metrics:
        return float(metrics["full_ndcg10_vs_best_baseline"]["ratio"])
    ours = metrics.get("test", {}).get("all", {}).get("NDCG@10")
    theirs = [b.get("all", {}).get("NDCG@10") for b in metrics.get("baselines_test", {}).values()]
    best = max((t for t in theirs if t is not None), default=None)
    return None if ours is None or not best else float(ours) / float(best)
