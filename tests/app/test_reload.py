"""Hot reload: new versions swap in without failed requests; broken ones leave the old serving."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import httpx2 as httpx
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.artifact import latest_versions

KEY = {"X-API-Key": "s3cret"}


def _root(tiny_artifacts: Path, tmp_path: Path) -> Path:
    root = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, root)
    return root


def _new_version(root: Path, name: str, version: str) -> Path:
    src = latest_versions(root)[name]
    dst = src.parent / version
    shutil.copytree(src, dst)
    return dst


def test_admin_needs_the_key(tiny_artifacts: Path, tmp_path: Path) -> None:
    root = _root(tiny_artifacts, tmp_path)
    with TestClient(create_app(Settings(artifacts_dir=root, device="cpu"))) as c:
        r = c.post("/admin/reload", headers=KEY)
        assert r.status_code == 403 and "disabled" in r.json()["error"]["message"]
    with TestClient(create_app(Settings(artifacts_dir=root, device="cpu", admin_api_key="s3cret"))) as c:
        assert c.post("/admin/reload").status_code == 403
        assert c.post("/admin/reload", headers={"X-API-Key": "nope"}).status_code == 403
        r = c.post("/admin/reload", headers=KEY)
        assert r.status_code == 200 and r.json()["loaded"] == {} and set(r.json()["unchanged"]) == {
            "sasrec-tiny", "bert4rec-tiny"}


def test_new_version_swaps_in_and_broken_one_keeps_the_old(tiny_artifacts: Path, tmp_path: Path) -> None:
    root = _root(tiny_artifacts, tmp_path)
    with TestClient(create_app(Settings(artifacts_dir=root, device="cpu", admin_api_key="s3cret"))) as c:
        _new_version(root, "sasrec-tiny", "29990101T000000Z")
        r = c.post("/admin/reload", headers=KEY).json()
        assert r["loaded"] == {"sasrec-tiny": "29990101T000000Z"}
        served = {m["name"]: m for m in c.get("/models").json()["models"]}
        # The manifest's version string is the training run's; the folder is what changed.
        assert c.post("/recommend", json={"queries": [{"user_id": "u1"}]}).status_code == 200

        bad = _new_version(root, "bert4rec-tiny", "29990101T000000Z")
        (bad / "model.pt").write_bytes(b"truncated")
        r = c.post("/admin/reload", headers=KEY).json()
        assert "bert4rec-tiny" in r["failed"] and "unreadable checkpoint" in r["failed"]["bert4rec-tiny"]
        ok = c.post("/recommend", json={"model": "bert4rec-tiny", "queries": [{"user_id": "u1"}]})
        assert ok.status_code == 200
        assert c.get("/readyz").json()["broken"] == {}  # still serving the old version
        assert served["bert4rec-tiny"]["version"] == c.get("/models").json()["models"][0]["version"]


def test_reload_under_load_fails_no_request(tiny_artifacts: Path, tmp_path: Path) -> None:
    root = _root(tiny_artifacts, tmp_path)
    app = create_app(Settings(artifacts_dir=root, device="cpu", admin_api_key="s3cret", max_wait_ms=5))

    async def go() -> tuple[list[int], dict]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                async def client(i: int) -> list[int]:
                    codes = []
                    for j in range(15):
                        r = await c.post("/recommend", json={"model": "sasrec-tiny",
                                                             "queries": [{"user_id": f"u{(i + j) % 40}"}]})
                        codes.append(r.status_code)
                    return codes

                async def reloader() -> dict:
                    await asyncio.sleep(0.05)
                    _new_version(root, "sasrec-tiny", "29990101T000000Z")
                    return (await c.post("/admin/reload", headers=KEY)).json()

                *codes, report = await asyncio.gather(*[client(i) for i in range(8)], reloader())
                return [x for cs in codes for x in cs], report

    codes, report = asyncio.run(go())
    assert report["loaded"] == {"sasrec-tiny": "29990101T000000Z"}
    assert codes == [200] * len(codes)
