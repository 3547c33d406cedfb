"""Convert an artifact version written with histories.json into the memory-mapped history table.

    python -m training convert-histories artifacts/sasrec-ml100k/20261122T111403Z
    python -m training convert-histories artifacts     # the newest version of every name that needs it

The old version is left as it is; the converted copy is published next to it under the same name with
a suffix (20261122T111403Z-2), so the service takes it as the newest at its next start or reload.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

from models import artifact
from models.history_table import HistoryColumns

log = logging.getLogger(__name__)


def convert_histories(folder: Path) -> Path:
    """Write a converted copy of `folder` and return it; raises ValueError when there is nothing to convert."""
    if not needs_conversion(folder):
        raise ValueError(
            f"{folder} has no {artifact.OLD_HISTORIES} to convert (or already a {artifact.HISTORIES}/ table)"
        )
    manifest = artifact.read_manifest(folder)
    raw = artifact.read_json(folder, artifact.OLD_HISTORIES)
    if not isinstance(raw, dict):
        raise ValueError(f"{folder / artifact.OLD_HISTORIES}: expected an object of user -> steps")
    # Steps name items (recommendation) or users (the social model, whose artifacts have no items.json).
    ids = artifact.read_id_map(folder, artifact.ITEMS if (folder / artifact.ITEMS).is_file() else artifact.USERS)
    action_ids = artifact.read_id_map(folder, artifact.ACTIONS) if (folder / artifact.ACTIONS).is_file() else None
    users, steps, times, actions = [], [], [], []
    for user, events in raw.items():
        if not isinstance(events, list) or not all(isinstance(e, list) and len(e) >= 2 for e in events):
            raise ValueError(f"{artifact.OLD_HISTORIES}: user {user!r} has steps that are not [id, time, ...] lists")
        users.append(str(user))
        steps.append([str(e[0]) for e in events])
        times.append([math.nan if e[1] is None else float(e[1]) for e in events])
        actions.append([str(e[2]) if len(e) > 2 else "" for e in events])
    tmp = artifact.new_version_dir(folder.parent.parent, folder.parent.name)
    try:
        for f in folder.iterdir():
            if f.name != artifact.OLD_HISTORIES and f.is_file():
                shutil.copy2(f, tmp / f.name)
            elif f.name == artifact.EVENTS and f.is_dir():  # a social model's event log (recent activity)
                shutil.copytree(f, tmp / f.name)
        HistoryColumns(
            users, steps, times, ids, actions=actions if action_ids is not None else None, action_ids=action_ids
        ).write(tmp / artifact.HISTORIES)
        # Refuse what the service would: the written table is opened as the loader opens it.
        artifact.read_history_table(tmp, n_ids=len(ids), n_actions=len(action_ids) if action_ids is not None else None)
        m = json.loads((tmp / artifact.MANIFEST).read_text())
        m.setdefault("converted_from", folder.name)
        (tmp / artifact.MANIFEST).write_text(json.dumps(m))
        final = artifact.publish(tmp, folder.name)
    except BaseException:
        artifact.discard(tmp)
        raise
    log.info("%s (%s): %d users' histories converted into %s", manifest.name, manifest.kind, len(users), final)
    return final


def needs_conversion(folder: Path) -> bool:
    return (folder / artifact.OLD_HISTORIES).is_file() and not (folder / artifact.HISTORIES).is_dir()


def convert_root(root: Path) -> list[Path]:
    """Convert the newest version of every artifact name under `root` that has the old layout."""
    if not root.is_dir():
        raise ValueError(f"{root}: no such folder")
    return [convert_histories(v) for v in artifact.latest_versions(root).values() if needs_conversion(v)]
