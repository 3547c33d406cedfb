"""Versions under control: listed with their state, pinned, unpinned and rolled back by an admin, the
choice kept in the history store (every worker, every restart)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx2 as httpx
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.artifact import latest_versions
from tests.servers import NEWER, start_api, stop, wait_until, workers_env

ADMIN = {"X-API-Key": "admin-key"}


def _settings(root: Path, state: Path) -> Settings:
    return Settings(
        artifacts_dir=root, device="cpu", admin_api_key="admin-key", history_path=state / "h.sqlite3", state_dir=state
    )


def _served(c: TestClient) -> str:
    r = c.post("/recommend", json={"model": "sasrec-tiny", "queries": [{"user_id": "u1", "k": 1}]})
    assert r.status_code == 200, r.text
    return str(r.json()["version"])


def test_pin_unpin_and_rollback_survive_a_restart(root: Path, tmp_path: Path) -> None:
    old = latest_versions(root)["sasrec-tiny"].parent
    versions = sorted(p.name for p in old.iterdir())
    first = versions[0]
    with TestClient(create_app(_settings(root, tmp_path / "state"))) as c:
        listed = c.get("/models/sasrec-tiny/versions").json()
        assert [v["version"] for v in listed["versions"]] == [NEWER, first]
        assert [v["state"] for v in listed["versions"]] == ["serving", "kept"] and listed["pinned"] is None
        assert listed["versions"][0]["metrics"] and listed["versions"][0]["created_at"]
        assert _served(c) == NEWER

        r = c.post("/admin/models/sasrec-tiny/pin", json={"version": first}, headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["pinned"] == first and r.json()["serving"] == first
        assert _served(c) == first
        listed = c.get("/models/sasrec-tiny/versions").json()
        assert listed["pinned"] == first and [v["state"] for v in listed["versions"]] == ["kept", "serving"]

    with TestClient(create_app(_settings(root, tmp_path / "state"))) as c:  # a restart keeps the pin
        assert _served(c) == first
        r = c.post("/admin/models/sasrec-tiny/unpin", headers=ADMIN)
        assert r.status_code == 200 and r.json()["pinned"] is None and _served(c) == NEWER
        r = c.post("/admin/models/sasrec-tiny/rollback", headers=ADMIN)
        assert r.status_code == 200 and r.json()["pinned"] == first and _served(c) == first
        r = c.post("/admin/models/sasrec-tiny/rollback", headers=ADMIN)  # nothing older than the first
        assert r.status_code == 409 and r.json()["error"]["code"] == "no_older_version"
        assert _served(c) == first


def test_version_calls_check_what_they_are_given(root: Path, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(root, tmp_path / "state"))) as c:
        pin = "/admin/models/sasrec-tiny/pin"
        assert c.post(pin, json={"version": NEWER}).status_code == 401
        assert c.post(pin, json={"version": NEWER}, headers={"X-API-Key": "wrong"}).status_code == 403
        r = c.post(pin, json={"version": "20000101T000000Z"}, headers=ADMIN)
        assert r.status_code == 404 and r.json()["error"]["details"][0]["loc"] == ["body", "version"]
        r = c.post(pin, json={"version": "../../etc"}, headers=ADMIN)
        assert r.status_code == 422
        r = c.post(pin, json={"version": "2" * 100_000}, headers=ADMIN)  # a body over 64 KiB: the large-body parser
        assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == ["body", "version"]
        r = c.post("/admin/models/no-such-model/pin", json={"version": NEWER}, headers=ADMIN)
        assert r.status_code == 404
        assert c.get("/models/no-such-model/versions").status_code == 404
        assert c.get("/models/..%2F..%2Fetc/versions").status_code in (404, 422)


def test_a_broken_pinned_version_leaves_the_serving_one(root: Path, tmp_path: Path) -> None:
    old = latest_versions(root)["sasrec-tiny"].parent
    first = sorted(p.name for p in old.iterdir())[0]
    (old / first / "items.json").write_text("[]")
    with TestClient(create_app(_settings(root, tmp_path / "state"))) as c:
        r = c.post("/admin/models/sasrec-tiny/pin", json={"version": first}, headers=ADMIN)
        assert r.status_code == 200 and f"sasrec-tiny/{first}" in r.json()["reload"]["failed"]
        assert _served(c) == NEWER
        states = {v["version"]: v["state"] for v in c.get("/models/sasrec-tiny/versions").json()["versions"]}
        assert states == {NEWER: "serving", first: "broken"}


def test_one_pin_moves_every_worker(root: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = workers_env(state)
    first = sorted(p.name for p in latest_versions(root)["sasrec-tiny"].parent.iterdir())[0]
    proc, url = start_api(root, env)
    try:
        body = {"model": "sasrec-tiny", "queries": [{"user_id": "u1", "k": 1}]}

        def versions_seen() -> set[str]:  # new connections spread over both workers
            return {httpx.post(f"{url}/recommend", json=body).json()["version"] for _ in range(30)}

        assert versions_seen() == {NEWER}
        r = httpx.post(f"{url}/admin/models/sasrec-tiny/pin", json={"version": first}, headers=ADMIN, timeout=60)
        assert r.status_code == 200 and r.json()["reload"]["all_workers"], r.text
        assert len(r.json()["reload"]["workers"]) == 2
        assert versions_seen() == {first}
    finally:
        stop(proc)
    proc, url = start_api(root, env)  # both workers of a new start serve the pinned version
    try:
        wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200)
        body = {"model": "sasrec-tiny", "queries": [{"user_id": "u1", "k": 1}]}
        assert {httpx.post(f"{url}/recommend", json=body).json()["version"] for _ in range(30)} == {first}
    finally:
        stop(proc)


def test_retention_keeps_the_newest_and_what_is_pinned(root: Path, tmp_path: Path) -> None:
    named = latest_versions(root)["sasrec-tiny"].parent
    first = sorted(p.name for p in named.iterdir())[0]
    for extra in ("20991231T235957Z", "20991231T235958Z"):
        shutil.copytree(named / NEWER, named / extra)
    settings = _settings(root, tmp_path / "state").model_copy(update={"keep_versions": 2})
    with TestClient(create_app(settings)) as c:
        r = c.post("/admin/models/sasrec-tiny/pin", json={"version": first}, headers=ADMIN)
        assert r.status_code == 200
        # The newest two stay, and the pinned (serving) first one; the one between goes.
        assert r.json()["reload"]["deleted"] == ["sasrec-tiny/20991231T235957Z"]
        assert sorted(p.name for p in named.iterdir()) == sorted([first, "20991231T235958Z", NEWER])
        assert _served(c) == first
        r = c.post("/admin/models/sasrec-tiny/unpin", headers=ADMIN)
        assert r.json()["reload"]["deleted"] == [f"sasrec-tiny/{first}"] and _served(c) == NEWER
    with TestClient(create_app(_settings(root, tmp_path / "state2"))) as c:  # 0: everything is kept
        assert c.post("/admin/reload", headers=ADMIN).json()["deleted"] == []
