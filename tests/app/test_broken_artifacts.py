"""A newest version that is wrong in any way: the service starts, serves the older version of that
model and every other model, and says which version is broken without showing a path."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.artifact import latest_versions

NEWER = "20991231T235959Z"


def _json(name: str, value: object) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_text(json.dumps(value))


def _manifest(**change: object) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        m = json.loads((folder / "manifest.json").read_text())
        m.update(change)
        (folder / "manifest.json").write_text(json.dumps(m))

    return edit


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "items.json is a list": _json("items.json", []),
    "a history column missing": lambda f: (f / "histories" / "items.npy").unlink(),
    "history columns of different lengths": lambda f: np.save(f / "histories" / "times.npy", np.zeros(3)),
    "a history column of another type": lambda f: np.save(f / "histories" / "ends.npy", np.zeros(40)),
    "a history column is garbage": lambda f: (f / "histories" / "hashes.npy").write_bytes(b"\x93NUMPY garbage"),
    "histories in the earlier JSON layout": lambda f: (
        shutil.rmtree(f / "histories"),
        _json("histories.json", {"u1": [["1", 5.0]]})(f),
    ),
    "config is not a table": _manifest(config="sasrec"),
    "kind of another task": _manifest(kind="mhsa"),
    "manifest.json not JSON": lambda f: (f / "manifest.json").write_text("{"),
    "weights are garbage": lambda f: (f / "model.pt").write_bytes(b"\x80\x04garbage"),
    "weights missing": lambda f: (f / "model.pt").unlink(),
    "deeply nested JSON": lambda f: (f / "item_meta.json").write_text("[" * 100_000 + "]" * 100_000),
    # Opening a FIFO blocks until a writer comes: refused by a look at the file, never opened.
    "a FIFO in place of a history column": lambda f: _fifo(f / "histories" / "items.npy"),
    "a FIFO in place of a JSON file": lambda f: _fifo(f / "item_meta.json"),
    "a FIFO in place of the weights": lambda f: _fifo(f / "model.pt"),
    "history rows out of order": lambda f: _edit_column(f, "ends", lambda a: a.__setitem__([0, 1], a[[1, 0]])),
    "negative row ends": lambda f: _edit_column(f, "ends", lambda a: a.__setitem__(0, -1)),
    "a history item outside the catalog": lambda f: _edit_column(f, "items", lambda a: a.__setitem__(0, 10**6)),
    "a negative history item": lambda f: _edit_column(f, "items", lambda a: a.__setitem__(0, -2)),
    "an infinite history time": lambda f: _edit_column(f, "times", lambda a: a.__setitem__(0, np.inf)),
    "user key ends out of order": lambda f: _edit_column(f, "key_ends", lambda a: a.__setitem__([0, 1], a[[1, 0]])),
    "item fields larger than the catalog warrants": lambda f: _json(
        "item_fields.json", {"fields": {"title": {"1": "x" * 3_000_000}}}
    )(f),
    "an item field no request can ask for": lambda f: _json("item_fields.json", {"fields": {"the title": {"1": "x"}}})(
        f
    ),
}


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _edit_column(folder: Path, name: str, change: Callable[[np.ndarray], None]) -> None:
    path = folder / "histories" / f"{name}.npy"
    column = np.load(path).copy()
    change(column)
    np.save(path, column)


def _broken_newest(src: Path, tmp_path: Path, name: str, corrupt: Callable[[Path], None]) -> tuple[Path, Path]:
    """A copy of the artifacts `src` whose `name` gets a newer version, broken by `corrupt`: (root, the
    good version)."""
    root = tmp_path / "arts"
    shutil.copytree(src, root)
    old = latest_versions(root)[name]
    shutil.copytree(old, old.parent / NEWER)
    corrupt(old.parent / NEWER)
    return root, old


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_a_broken_newest_version_falls_back_to_the_older_one(
    tiny_location_artifact: Path, tmp_path: Path, corrupt: Callable[[Path], None]
) -> None:
    root, old = _broken_newest(tiny_location_artifact, tmp_path, "sasrec-tiny", corrupt)
    # A stray folder is not a version, however new its files: only the name shape counts.
    shutil.copytree(old, old.parent / "backup")
    # Each defect is found by a check, not by the loading deadline (a blocked open would reach it).
    with TestClient(create_app(Settings(artifacts_dir=root, device="cpu", load_timeout_s=10))) as c:
        ready = c.get("/readyz")
        assert ready.status_code == 200, ready.text
        body = ready.json()
        assert body["models"] == ["bert4rec-tiny", "mhsa-tiny", "sasrec-tiny"]
        assert list(body["broken"]) == [f"sasrec-tiny/{NEWER}"]
        assert "not loaded within" not in ready.text
        assert str(root) not in ready.text and "Traceback" not in ready.text
        versions = {m["name"]: m["version"] for m in c.get("/models").json()["models"]}
        assert versions["sasrec-tiny"] == old.name
        r = c.post("/recommend", json={"model": "sasrec-tiny", "queries": [{"user_id": "u1"}]})
        assert r.status_code == 200 and r.json()["version"] == old.name
        step = {"location_id": "home1", "start_min": 420, "weekday": 1, "duration_min": 600}
        r = c.post("/next-location", json={"queries": [{"history": [step]}]})
        assert r.status_code == 200


def test_reload_onto_a_broken_version_keeps_serving_and_says_why(tiny_artifacts: Path, tmp_path: Path) -> None:
    root = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, root)
    old = latest_versions(root)["sasrec-tiny"]
    settings = Settings(artifacts_dir=root, device="cpu", admin_api_key="k")
    with TestClient(create_app(settings)) as c:
        shutil.copytree(old, old.parent / NEWER)
        CORRUPTIONS["items.json is a list"](old.parent / NEWER)
        r = c.post("/admin/reload", headers={"x-api-key": "k"})
        assert r.status_code == 200, r.text
        failed = r.json()["failed"]
        assert list(failed) == [f"sasrec-tiny/{NEWER}"] and failed[f"sasrec-tiny/{NEWER}"].startswith("items.json: ")
        assert (
            c.post("/recommend", json={"model": "sasrec-tiny", "queries": [{"user_id": "u1"}]}).json()["version"]
            == old.name
        )


def test_a_version_that_does_not_load_in_time_is_broken_and_reload_moves_on(
    tiny_artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that never returns (a hung mount): the version is reported broken after the deadline, the
    reload answers, and the next reload is not queued behind the stuck one."""
    from app.loaded import LoadedModels

    root = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, root)
    old = latest_versions(root)["sasrec-tiny"]
    release = threading.Event()
    load = LoadedModels._load

    def stuck(self: LoadedModels, name: str, folder: Path, *args: object) -> object:
        if folder.name == NEWER:
            release.wait(30)
        return load(self, name, folder, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(LoadedModels, "_load", stuck)
    settings = Settings(artifacts_dir=root, device="cpu", admin_api_key="k", load_timeout_s=0.5)
    try:
        with TestClient(create_app(settings)) as c:
            shutil.copytree(old, old.parent / NEWER)
            for _ in range(2):
                r = c.post("/admin/reload", headers={"x-api-key": "k"})
                assert r.status_code == 200, r.text
                assert "not loaded within 0.5 s" in r.json()["failed"][f"sasrec-tiny/{NEWER}"]
            ready = c.get("/readyz").json()
            assert f"sasrec-tiny/{NEWER}" in ready["broken"] and "sasrec-tiny" in ready["models"]
            r = c.post("/recommend", json={"model": "sasrec-tiny", "queries": [{"user_id": "u1"}]})
            assert r.status_code == 200 and r.json()["version"] == old.name
    finally:
        release.set()


SOCIAL_CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "the event log missing": lambda f: shutil.rmtree(f / "events"),
    "the event log out of time order": lambda f: np.save(
        f / "events" / "times.npy", np.load(f / "events" / "times.npy")[::-1].copy()
    ),
    "the event log naming users the model lacks": lambda f: np.save(
        f / "events" / "made.npy", np.full(len(np.load(f / "events" / "made.npy")), 10**6, dtype=np.int32)
    ),
    "the event log with a negative user": lambda f: np.save(
        f / "events" / "received.npy", np.full(len(np.load(f / "events" / "received.npy")), -1, dtype=np.int32)
    ),
    "the event log with an infinite time": lambda f: np.save(
        f / "events" / "times.npy", np.append(np.load(f / "events" / "times.npy")[:-1], np.inf)
    ),
    "history actions outside the action map": lambda f: _edit_column(f, "actions", lambda a: a.__setitem__(0, 99)),
}


@pytest.mark.parametrize("corrupt", SOCIAL_CORRUPTIONS.values(), ids=SOCIAL_CORRUPTIONS.keys())
def test_a_social_version_with_a_broken_event_log_falls_back(
    tiny_social_artifact: Path, tmp_path: Path, corrupt: Callable[[Path], None]
) -> None:
    root, old = _broken_newest(tiny_social_artifact, tmp_path, "social-tiny", corrupt)
    with TestClient(create_app(Settings(artifacts_dir=root, device="cpu"))) as c:
        body = c.get("/readyz").json()
        reason = json.dumps(body["broken"])
        assert list(body["broken"]) == [f"social-tiny/{NEWER}"] and ("events" in reason or "histories" in reason)
        assert str(root) not in json.dumps(body)
        r = c.post("/recommend", json={"model": "social-tiny", "queries": [{"user_id": "s3"}]})
        assert r.status_code == 200 and r.json()["version"] == old.name


def test_readiness_forgets_a_broken_version_once_its_folder_is_deleted(tiny_artifacts: Path, tmp_path: Path) -> None:
    root, old = _broken_newest(tiny_artifacts, tmp_path, "sasrec-tiny", CORRUPTIONS["items.json is a list"])
    with TestClient(create_app(Settings(artifacts_dir=root, device="cpu", admin_api_key="k"))) as c:
        assert list(c.get("/readyz").json()["broken"]) == [f"sasrec-tiny/{NEWER}"]
        shutil.rmtree(old.parent / NEWER)
        assert c.post("/admin/reload", headers={"x-api-key": "k"}).status_code == 200
        assert c.get("/readyz").json().get("broken", {}) == {}
