"""Writes one artifact version folder: manifest, weights, the task's files, metrics, config, curves."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from models import artifact
from models.activity import EventLog
from models.checkpoint import save_checkpoint
from models.history_table import HistoryColumns
from models.ids import IdMap
from models.manifest import Manifest
from training.history_shares import HistoryShares
from training.loop import History

log = logging.getLogger(__name__)


def plot_curves(history: History, path: Path, *, title: str, keys: tuple[str, ...]) -> None:
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
        for k, c in zip(shown, ("tab:orange", "tab:green", "tab:red"), strict=False):
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
    *,
    manifest: Manifest,
    model: nn.Module,
    files: dict[str, Any],
    history: History,
    curve_keys: tuple[str, ...],
) -> Path:
    """Write weights, the given files, metrics, config, curves and the manifest, then publish."""
    tmp = artifact.new_version_dir(out_root, manifest.name)
    try:
        save_checkpoint(tmp / artifact.WEIGHTS, manifest.kind, model)
        for fname, obj in files.items():
            if isinstance(obj, IdMap):
                obj.save(tmp / fname)
            elif isinstance(obj, np.ndarray):  # a table the service memory-maps or loads (never a pickle)
                np.save(tmp / fname, obj, allow_pickle=False)
            elif isinstance(obj, HistoryColumns | HistoryShares | EventLog):
                obj.write(tmp / fname)
            else:
                artifact.write_json(tmp / fname, obj)
        artifact.write_json(tmp / artifact.METRICS, manifest.metrics)
        artifact.write_json(tmp / artifact.RUN_CONFIG, manifest.config)
        plot_curves(history, tmp / artifact.CURVES, title=f"{manifest.name} ({manifest.kind})", keys=curve_keys)
        artifact.write_json(tmp / artifact.MANIFEST, manifest.to_json())
        final = artifact.publish(tmp, manifest.version)
    except BaseException:
        artifact.discard(tmp)
        raise
    log.info("artifact written to %s", final)
    return final
