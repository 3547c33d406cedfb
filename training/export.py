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


def plot_curves(history: History, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax1 = plt.subplots(figsize=(7, 4))
    ax1.plot(history.epoch, history.loss, color="tab:blue", label="training loss")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("training loss", color="tab:blue")
    keys = [k for k in ("NDCG@10", "HR@10") if any(k in v for v in history.val)]
    if keys:
        ax2 = ax1.twinx()
        for k, c in zip(keys, ("tab:orange", "tab:green"), strict=False):
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
    now = dt.datetime.now(dt.UTC)
    version = now.strftime("%Y%m%dT%H%M%SZ")
    tmp = A.new_version_dir(out_root, name)
    try:
        save_checkpoint(tmp / A.WEIGHTS, kind, model)
        items.save(tmp / A.ITEMS)
        users.save(tmp / A.USERS)
        A.write_json(tmp / A.ITEM_META, {"unit": data.release_unit, "release": data.release})
        A.write_json(
            tmp / A.HISTORIES,
            {
                u: [[i, None if math.isnan(t) else t] for i, t in zip(seq, ts, strict=True)]
                for u, seq, ts in zip(data.users, data.items, data.times, strict=True)
            },
        )
        A.write_json(tmp / A.METRICS, metrics)
        A.write_json(tmp / A.RUN_CONFIG, run_config)
        plot_curves(history, tmp / A.CURVES, f"{name} ({kind})")
        manifest = {
            "name": name,
            "kind": kind,
            "task": "recommend",
            "format_version": FORMAT_VERSION,
            "version": version,
            "created_at": now.isoformat(),
            "data": {
                "source": data.source,
                "sha256": data.sha256,
                "users": len(data.users),
                "items": items.n_entities,
                "interactions": data.n_interactions,
                "release_unit": data.release_unit,
            },
            "config": run_config,
            "metrics": metrics,
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
