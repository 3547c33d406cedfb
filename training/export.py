"""Writes one artifact version folder: manifest, weights, id maps, metadata, metrics, curves."""

from __future__ import annotations

import datetime as dt
import logging
import math
from pathlib import Path
from typing import Any

from torch import nn

from models import artifact as A
from models.checkpoint import FORMAT_VERSION, save_checkpoint
from models.ids import IdMap
from training.data import Interactions
from training.loop import History

log = logging.getLogger(__name__)


def plot_curves(history: History, path: Path, title: str, keys: tuple[str, ...]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax1 = plt.subplots(figsize=(7, 4))
    ax1.plot(history.epoch, history.loss, color="tab:blue", label="training loss")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("training loss", color="tab:blue")
    shown = [k for k in keys if any(k in v for v in history.val)]
    if shown:
        ax2 = ax1.twinx()
        for k, c in zip(shown, ("tab:orange", "tab:green"), strict=False):
            ax2.plot(history.epoch, [v.get(k, math.nan) for v in history.val], color=c, label=f"val {k}")
        ax2.set_ylabel("validation")
        ax2.legend(loc="center right")
    if history.best_epoch:
        ax1.axvline(history.best_epoch, color="grey", linestyle=":", label="best epoch")
    ax1.legend(loc="upper right")
    ax1.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def export_artifact(
    out_root: Path,
    name: str,
    kind: str,
    task: str,
    model: nn.Module,
    files: dict[str, Any],
    data_info: dict[str, Any],
    metrics: dict[str, Any],
    run_config: dict[str, Any],
    history: History,
    curve_keys: tuple[str, ...],
    extra_manifest: dict[str, Any] | None = None,
) -> Path:
    """Write weights, the given JSON `files`, metrics, config, curves and the manifest, then publish."""
    now = dt.datetime.now(dt.UTC)
    version = now.strftime("%Y%m%dT%H%M%SZ")
    tmp = A.new_version_dir(out_root, name)
    try:
        save_checkpoint(tmp / A.WEIGHTS, kind, model)
        for fname, obj in files.items():
            if isinstance(obj, IdMap):
                obj.save(tmp / fname)
            else:
                A.write_json(tmp / fname, obj)
        A.write_json(tmp / A.METRICS, metrics)
        A.write_json(tmp / A.RUN_CONFIG, run_config)
        plot_curves(history, tmp / A.CURVES, f"{name} ({kind})", curve_keys)
        manifest = {
            "name": name, "kind": kind, "task": task, "format_version": FORMAT_VERSION,
            "version": version, "created_at": now.isoformat(), "data": data_info,
            "config": run_config, "metrics": metrics, **(extra_manifest or {}),
        }
        A.write_json(tmp / A.MANIFEST, manifest)
        suffix, final = 1, None
        while final is None:
            try:
                final = A.publish(tmp, version if suffix == 1 else f"{version}-{suffix}")
            except FileExistsError:
                suffix += 1
    except BaseException:
        A.discard(tmp)
        raise
    log.info("artifact written to %s", final)
    return final


def export_recommender(
    out_root: Path,
    name: str,
    kind: str,
    model: nn.Module,
    items: IdMap,
    users: IdMap,
    data: Interactions,
    metrics: dict[str, Any],
    run_config: dict[str, Any],
    history: History,
) -> Path:
    files = {
        A.ITEMS: items,
        A.USERS: users,
        A.ITEM_META: {"unit": data.release_unit, "release": data.release},
        A.HISTORIES: {
            u: [[i, None if math.isnan(t) else t] for i, t in zip(seq, ts, strict=True)]
            for u, seq, ts in zip(data.users, data.items, data.times, strict=True)
        },
    }
    info = {
        "source": data.source, "sha256": data.sha256, "users": len(data.users), "items": items.n_entities,
        "interactions": data.n_interactions, "release_unit": data.release_unit,
    }
    return export_artifact(
        out_root, name, kind, "recommend", model, files, info, metrics, run_config, history, ("NDCG@10", "HR@10")
    )
