"""Versions under control: listed with their state, pinned, unpinned and rolled back by an admin, the
choice kept in the history store (every worker, every restart)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx2 as httpx
import pytest
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


def test_a_broken_version_is_refused_as_a_pin(root: Path, tmp_path: Path) -> None:
    old = latest_versions(root)["sasrec-tiny"].parent
    first = sorted(p.name for p in old.iterdir())[0]
    (old / first / "items.json").write_text("[]")
    with TestClient(create_app(_settings(root, tmp_path / "state"))) as c:
        r = c.post("/admin/models/sasrec-tiny/pin", json={"version": first}, headers=ADMIN)
        assert r.status_code == 409 and r.json()["error"]["code"] == "broken_version", r.text
        assert r.json()["error"]["details"][0]["loc"] == ["body", "version"]
        assert _served(c) == NEWER
        listed = c.get("/models/sasrec-tiny/versions").json()
        assert {v["version"]: v["state"] for v in listed["versions"]} == {NEWER: "serving", first: "broken"}
        assert listed["pinned"] is None  # nothing was kept


def _truncate(folder: Path) -> None:
    weights = folder / "model.pt"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def test_a_rollback_checks_its_target_and_skips_a_broken_one(root: Path, tmp_path: Path) -> None:
    named = latest_versions(root)["sasrec-tiny"].parent
    first = sorted(p.name for p in named.iterdir())[0]
    mid = "20991231T235958Z"
    shutil.copytree(named / NEWER, named / mid)
    _truncate(named / mid)  # never loaded by this process: the newest serves
    with TestClient(create_app(_settings(root, tmp_path / "state"))) as c:
        assert _served(c) == NEWER
        r = c.post("/admin/models/sasrec-tiny/rollback", headers=ADMIN)
        assert r.status_code == 200 and r.json()["pinned"] == first and _served(c) == first, r.text
        states = {v["version"]: v["state"] for v in c.get("/models/sasrec-tiny/versions").json()["versions"]}
        assert states[mid] == "broken"
    shutil.rmtree(named / first)  # now nothing older than the newest loads: refused, the pin unchanged
    with TestClient(create_app(_settings(root, tmp_path / "other"))) as c:
        r = c.post("/admin/models/sasrec-tiny/rollback", headers=ADMIN)
        assert r.status_code == 409 and r.json()["error"]["code"] == "no_older_version"
        assert c.get("/models/sasrec-tiny/versions").json()["pinned"] is None and _served(c) == NEWER


def test_a_pin_that_fails_at_a_restart_never_hands_the_model_to_a_newer_version(root: Path, tmp_path: Path) -> None:
    named = latest_versions(root)["sasrec-tiny"].parent
    first = sorted(p.name for p in named.iterdir())[0]
    mid = "20991231T235958Z"
    shutil.copytree(named / NEWER, named / mid)
    state = tmp_path / "state"
    with TestClient(create_app(_settings(root, state))) as c:
        assert c.post("/admin/models/sasrec-tiny/pin", json={"version": mid}, headers=ADMIN).status_code == 200
        assert _served(c) == mid
    _truncate(named / mid)  # broken between two starts
    with TestClient(create_app(_settings(root, state))) as c:
        assert _served(c) == first  # the newest older than the pin, not the newest
        assert c.get("/readyz").json()["broken"][f"sasrec-tiny/{mid}"]


def test_a_pinned_version_whose_folder_goes_keeps_serving_and_says_so(root: Path, tmp_path: Path) -> None:
    named = latest_versions(root)["sasrec-tiny"].parent
    first = sorted(p.name for p in named.iterdir())[0]
    with TestClient(create_app(_settings(root, tmp_path / "state"))) as c:
        assert c.post("/admin/models/sasrec-tiny/pin", json={"version": first}, headers=ADMIN).status_code == 200
        shutil.rmtree(named / first)
        r = c.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 200 and _served(c) == first  # the loaded copy, not the newest
        reason = c.get("/readyz").json()["broken"][f"sasrec-tiny/{first}"]
        assert "not on disk" in reason and "keeps serving" in reason
        assert c.get("/models/sasrec-tiny/versions").json()["pinned"] == first


def test_a_broken_candidate_is_refused_and_never_runs(root: Path, tmp_path: Path) -> None:
    named = latest_versions(root)["sasrec-tiny"].parent
    first = sorted(p.name for p in named.iterdir())[0]
    (named / first / "manifest.json").write_text("{")
    with TestClient(create_app(_settings(root, tmp_path / "state"))) as c:
        body = {"version": first, "mode": "canary", "share": 0.5}
        r = c.post("/admin/models/sasrec-tiny/candidate", json=body, headers=ADMIN)
        assert r.status_code == 409 and r.json()["error"]["code"] == "broken_version", r.text
        listed = c.get("/models/sasrec-tiny/versions").json()
        assert listed["candidate"] is None and listed["pinned"] is None
    settings = _settings(root, tmp_path / "canary").model_copy(update={"new_versions": "canary"})
    with TestClient(create_app(settings)) as c:
        newest = "29990101T000000Z"  # a new release that does not load, with new versions tried as canaries
        shutil.copytree(named / NEWER, named / newest)
        (named / newest / "model.pt").unlink()
        assert c.post("/admin/reload", headers=ADMIN).status_code == 200
        listed = c.get("/models/sasrec-tiny/versions").json()
        assert listed["candidate"] is None and _served(c) == NEWER
        assert {v["version"]: v["state"] for v in listed["versions"]}[newest] == "broken"
        refused = 'seqserve_candidate_changes_total{action="refused_broken",model="sasrec-tiny"} 1.0'
        assert refused in c.get("/metrics").text  # a decision made by itself is counted


def test_a_model_name_the_file_system_refuses_is_a_404(root: Path, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(root, tmp_path / "state"))) as c:
        for name in ("a" * 255, "b" * 200):
            assert c.get(f"/models/{name}/versions").status_code == 404
            assert c.post(f"/admin/models/{name}/rollback", headers=ADMIN).status_code == 404
        for name in ("a" * 256, ".hidden", "..."):
            r = c.get(f"/models/{name}/versions")
            assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == ["path", "name"], name


@pytest.mark.slow
def test_one_pin_moves_every_worker(root: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = workers_env(state)
    first = sorted(p.name for p in latest_versions(root)["sasrec-tiny"].parent.iterdir())[0]
    proc, url = start_api(root, env)
    try:
        body = {"model": "sasrec-tiny", "queries": [{"user_id": "u1", "k": 1}]}

        def versions_seen() -> set[str]:  # new connections spread over both workers
            return {httpx.post(f"{url}/recommend", json=body).json()["version"] for _ in range(30)}

        def both_up() -> bool:  # /readyz answers from the first worker up; the second may still be loading
            return len(httpx.post(f"{url}/admin/reload", headers=ADMIN, timeout=60).json()["workers"]) == 2

        wait_until(both_up, timeout=60)  # before any answer is read: a worker still loading has no version
        assert versions_seen() == {NEWER}
        r = httpx.post(f"{url}/admin/models/sasrec-tiny/pin", json={"version": first}, headers=ADMIN, timeout=60)
        assert r.status_code == 200 and r.json()["reload"]["all_workers"], r.text
        assert len(r.json()["reload"]["workers"]) == 2
        assert versions_seen() == {first}
    finally:
        stop(proc)
    # A new start reads the pin the workers wrote (each worker reads it alike: the restart test above has
    # the rest; a second two-worker start here cost ten seconds of the suite for nothing more).
    with TestClient(create_app(_settings(root, state))) as c:
        assert _served(c) == first


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


def test_retention_never_keeps_a_broken_version_in_a_good_ones_place(root: Path, tmp_path: Path) -> None:
    named = latest_versions(root)["sasrec-tiny"].parent
    first = sorted(p.name for p in named.iterdir())[0]
    mid = "20991231T235958Z"  # good, never loaded
    shutil.copytree(named / NEWER, named / mid)
    (named / NEWER / "items.json").write_text("[]")  # the newest is broken
    settings = _settings(root, tmp_path / "state").model_copy(update={"keep_versions": 1})
    with TestClient(create_app(settings)) as c:
        assert _served(c) == mid
        r = c.post("/admin/models/sasrec-tiny/pin", json={"version": first}, headers=ADMIN)
        assert r.status_code == 200 and _served(c) == first
        assert r.json()["reload"]["deleted"] == [f"sasrec-tiny/{NEWER}"]
        assert sorted(p.name for p in named.iterdir()) == sorted([first, mid])


def test_retention_checks_a_version_published_behind_a_pin_before_it_counts_as_good(root: Path, tmp_path: Path) -> None:
    """A broken version published after the pin was never loaded, so never known broken: it must not take
    the place of the newest good one."""
    named = latest_versions(root)["sasrec-tiny"].parent
    first = sorted(p.name for p in named.iterdir())[0]
    settings = _settings(root, tmp_path / "state").model_copy(update={"keep_versions": 1})
    with TestClient(create_app(settings)) as c:
        r = c.post("/admin/models/sasrec-tiny/pin", json={"version": first}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["reload"]["deleted"] == []
        later = f"{NEWER}-2"  # published behind the pin, and broken
        shutil.copytree(named / NEWER, named / later)
        (named / later / "items.json").write_text("[]")
        r = c.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 200 and r.json()["deleted"] == [f"sasrec-tiny/{later}"]
        assert sorted(p.name for p in named.iterdir()) == sorted([first, NEWER])
        assert _served(c) == first
