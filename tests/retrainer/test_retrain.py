"""python -m retrainer.retrain (scripts/retrain.sh): the version the service serves, continued on its log and the
live events, published, and the service reloaded onto it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx2 as httpx
import pytest

from models.artifact import versions
from retrainer import retrain
from tests.servers import NEWER, ROOT, start_api, stop

KEY = "admin-key"
ADMIN = {"X-API-Key": KEY}


@pytest.mark.slow
def test_a_retrain_continues_the_served_version_and_the_service_serves_the_new_one(
    tiny_artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, root)
    old = versions(root / "sasrec-tiny")[0]
    shutil.copytree(old, old.parent / NEWER)  # the newest on disk, which the service is pinned away from
    env = {
        "SEQSERVE_ARTIFACTS_DIR": str(root),
        "SEQSERVE_HISTORY_PATH": str(tmp_path / "history.sqlite3"),
        "SEQSERVE_ADMIN_API_KEY": KEY,
    }
    proc, url = start_api(root, env)
    try:
        pinned = httpx.post(f"{url}/admin/models/sasrec-tiny/pin", json={"version": old.name}, headers=ADMIN)
        assert pinned.status_code == 200, pinned.text
        event = {"event_id": "n1", "user_id": "newcomer", "item_id": "brand-new", "timestamp": 1.5e9}
        assert httpx.post(f"{url}/events", json={"model": "sasrec-tiny", "events": [event]}).status_code == 200
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("SEQSERVE_ADMIN_API_KEY", "not-the-key")
        assert retrain.main(["sasrec-tiny", "--minutes", "0.05", "--api-url", url]) == 1  # published, not reloaded
        assert "the reload was refused (403)" in capsys.readouterr().err
        refused = {v.name for v in versions(root / "sasrec-tiny")} - {old.name, NEWER}
        monkeypatch.setenv("SEQSERVE_ADMIN_API_KEY", KEY)
        assert retrain.main(["sasrec-tiny", "--minutes", "0.05", "--api-url", url]) == 0
        err = capsys.readouterr().err
        (new,) = (v for v in versions(root / "sasrec-tiny") if v.name not in {old.name, NEWER, *refused})
        assert len(refused) == 1
        # Pinned to the older version: the reload serves what it served, and the retrain says why.
        assert "neither serves nor runs as a candidate: a pin, a trial or a probation keeps" in err
        run = json.loads((new / "run_config.json").read_text())
        assert run["warm_start"]["from"] == f"sasrec-tiny/{old.name}"  # the served version, not the newest
        assert "brand-new" in json.loads((new / "items.json").read_text())["ids"]  # the live event was read
        moved = httpx.post(f"{url}/admin/models/sasrec-tiny/pin", json={"version": new.name}, headers=ADMIN)
        assert moved.status_code == 200, moved.text  # the service loads and serves what the retrain published
        served = {m["name"]: m["version"] for m in httpx.get(f"{url}/models").json()["models"]}
        assert served["sasrec-tiny"] == new.name
    finally:
        stop(proc)


def test_a_retrain_of_a_model_with_no_artifact_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SEQSERVE_ARTIFACTS_DIR", str(tmp_path))
    assert retrain.main(["nothing-here"]) == 2
    assert "retrain: no artifact" in capsys.readouterr().err


def test_scripts_retrain_sh_runs_the_python_entry() -> None:
    """The compose `retrain` profile's entrypoint: the environment, then `python -m retrainer.retrain`."""
    text = (ROOT / "scripts" / "retrain.sh").read_text()
    assert "scripts/bootstrap.sh" in text and "exec .venv/bin/python -m retrainer.retrain" in text
