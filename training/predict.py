"""Batch prediction: top-K for every stored user of an artifact, through the served engine itself
(the same preparation, exclusions, filters and hidden items as the service's route), to CSV. Any task
whose engine keeps user histories (models.tasks.recommend.UserQueryEngine: recommendation, social) can."""

from __future__ import annotations

import csv
import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path

from models.artifact import read_manifest
from models.catalog import FilterError
from models.engine import EngineOptions
from models.tasks import TASKS
from models.tasks.recommend import RecQuery, UserQueryEngine


def read_hidden(path: Path) -> list[str]:
    """Hidden ids from a file: GET /models/{name}/items/hidden's answer (JSON), or one id a line."""
    text = path.read_text()
    try:
        doc = json.loads(text)
    except ValueError:
        return [line.strip() for line in text.splitlines() if line.strip()]
    if isinstance(doc, dict) and isinstance(doc.get("items"), list):
        return [str(h["item_id"]) for h in doc["items"] if isinstance(h, dict) and "item_id" in h]
    raise ValueError(f"{path}: expected GET /models/{{name}}/items/hidden's JSON or one id a line")


def predict_all(
    artifact_dir: Path,
    *,
    k: int,
    out_dir: Path,
    batch_size: int = 256,
    rule: object = None,
    hidden: Sequence[str] = (),
) -> Path:
    """`rule`: a filter every list obeys (models/catalog.py); `hidden`: ids no list holds."""
    manifest = read_manifest(artifact_dir)
    task = TASKS.get(manifest.task)
    if task is None or task.route is None:
        raise ValueError(f"task {manifest.task!r} of {artifact_dir} is not served, so it cannot predict")
    engine = task.open(artifact_dir, EngineOptions())
    if not isinstance(engine, UserQueryEngine):
        raise ValueError(f"{task.name} artifacts keep no user histories to predict for")
    engine.rules.hide(hidden)
    if rule is not None:
        try:
            engine.rules.parse(rule)
        except FilterError as exc:
            raise ValueError(f"the filter at {list(exc.path)}: {exc}") from None
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"predictions_{engine.manifest.name or artifact_dir.parent.name}_k{k}_{stamp}.csv"
    users = list(engine.stored_users())
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["user_id", "item_id", "rank", "score"])
        for lo in range(0, len(users), batch_size):
            batch = users[lo : lo + batch_size]
            results = engine.answer([RecQuery(user_id=u, k=k, filter=rule) for u in batch])
            for r in results:
                w.writerows((r.user_id, item, rank, f"{score:.6f}") for rank, (item, score) in enumerate(r.items, 1))
    return out
