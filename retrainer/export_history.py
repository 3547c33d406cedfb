"""Write a namespace's histories (the newest artifact's histories + live events) as a training log.

    python -m retrainer.export_history --namespace ml-100k --out runs/ml100k_with_events.csv

Uses the same SEQSERVE_* settings as the service (artifacts folder, store kind, SQLite path, Redis URL);
the base is the newest version, among the artifacts of that namespace, that keeps user histories. The log is a
CSV with a header, quoted by the csv module so that any id (spaces, commas, quotes, newlines) reads
back exactly, and an id a spreadsheet would run as a formula (`=...`) behind a leading apostrophe, which
training's readers take off (models.ids.to_csv_cell): `user_id,item_id,timestamp[,action]`, the
timestamp empty when the data has none (e.g.
Amazon Beauty, whose order is kept). `python -m training train --data ...` reads it, so items first
seen in events become part of the catalog at the next training run. A social model's incoming steps
("<-a2q" on the target's timeline) are left out: each is the actor's event again, which the log holds.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.store import open_store
from models.artifact import ArtifactError, latest_versions, read_manifest
from models.engine import EngineOptions, optional_time, received_steps
from models.ids import to_csv_cell, trainable
from models.queries import Timeline
from models.tasks import TASKS, Task
from models.tasks.recommend import UserQueryEngine
from retrainer.settings import RetrainerSettings


def _keeps_histories(task: Task) -> bool:
    return isinstance(task.engine, type) and issubclass(task.engine, UserQueryEngine)


def newest_engine(artifacts: Path, namespace: str) -> UserQueryEngine | None:
    """The newest version (by its time) of the namespace's artifacts that keeps user histories."""
    found = []
    for folder in latest_versions(artifacts).values():
        try:
            manifest = read_manifest(folder)
        except ArtifactError:
            continue
        task = TASKS.get(manifest.task)
        if manifest.namespace == namespace and task is not None and _keeps_histories(task):
            found.append((folder.name, folder, task))
    for _, folder, task in sorted(found, key=lambda f: f[0], reverse=True):
        try:
            engine = task.open(folder, EngineOptions(trace=False))
        except ArtifactError as exc:
            print(f"skipping {folder}: {exc}", file=sys.stderr)
            continue
        assert isinstance(engine, UserQueryEngine)
        return engine
    return None


@dataclass
class Skipped:
    """Rows left out because training would refuse them (an id of only whitespace), per column."""

    counts: dict[str, int] = field(default_factory=dict)

    def keep(self, ids: dict[str, str]) -> bool:
        blank = next((col for col, raw in ids.items() if not trainable(raw)), None)
        if blank is not None:
            self.counts[blank] = self.counts.get(blank, 0) + 1
        return blank is None


def _rows(
    user: str, timeline: Timeline, *, with_actions: bool, skipped: Skipped, received: Callable[[str | None], bool]
) -> list[list[str]]:
    return [
        [
            to_csv_cell(user),
            to_csv_cell(item),
            "" if math.isnan(t) else (f"{t:.0f}" if t == int(t) else repr(t)),
            *([to_csv_cell(action or "")] if with_actions else []),
        ]
        for item, t, action in timeline
        if not received(action)
        and skipped.keep({"user_id": user, "item_id": item, **({"action": action or ""} if with_actions else {})})
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m retrainer.export_history", description=__doc__.split("\n")[0])
    p.add_argument("--namespace", required=True, help="the data set's name (POST /events answers it)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--artifacts", type=Path, help="the artifacts folder (default: SEQSERVE_ARTIFACTS_DIR's)")
    args = p.parse_args(argv)
    s = RetrainerSettings()
    engine = newest_engine(args.artifacts or s.artifacts_dir, args.namespace)
    store = open_store(**s.store_args())
    try:
        live_users = list(store.users(args.namespace))
        live = {
            u: tl
            for start in range(0, len(live_users), 500)
            for u, tl in store.events(args.namespace, live_users[start : start + 500]).items()
        }
    finally:
        store.close()
    if engine is None and not live:
        print(
            f"namespace {args.namespace!r} holds no history (no artifact of it under the artifacts folder,"
            f" no live event in the {s.history_store} store)",
            file=sys.stderr,
        )
        return 1
    with_actions = engine is not None and engine.action_ids is not None
    # A social model's received steps are each the actor's event again, which the log holds already.
    received = received_steps(engine)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    n, users, skipped = 0, set[str](), Skipped()
    with args.out.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["user_id", "item_id", "timestamp", *(["action"] if with_actions else [])])
        # Base rows first, live rows after: the loader keeps file order within a user (a stable sort).
        base = ((u, engine.stored_timeline(u)) for u in engine.stored_users()) if engine is not None else iter(())
        for user, timeline in base:
            rows = _rows(user, timeline, with_actions=with_actions, skipped=skipped, received=received)
            w.writerows(rows)
            n, users = n + len(rows), users | ({user} if rows else set())
        for user, tl in live.items():
            # Events the artifact already holds (the service drops them from the store when it loads it) count once.
            held = engine.stored_events(user) if engine is not None else set()
            fresh = [e for e in tl if (e[0], optional_time(e[1])) not in held]
            rows = _rows(user, fresh, with_actions=with_actions, skipped=skipped, received=received)
            w.writerows(rows)
            n, users = n + len(rows), users | ({user} if rows else set())
    print(f"wrote {n} interactions of {len(users)} users to {args.out}", file=sys.stderr)
    for col, count in sorted(skipped.counts.items()):
        print(f"skipped {count} interaction(s) with a blank {col}: training would refuse them", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
