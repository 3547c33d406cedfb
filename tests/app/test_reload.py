"""Hot reload: new versions swap in without failed requests; broken ones leave the old serving."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import httpx2 as httpx
import pytest
import torch
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.artifact import latest_versions
from tests.servers import NEWER, wait_until, wait_until_async

KEY = {"X-API-Key": "s3cret"}


def _root(tiny_artifacts: Path, tmp_path: Path) -> Path:
    root = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, root)
    return root


def _new_version(root: Path, name: str, version: str, nudge: float = 0.0) -> Path:
    """A copy of the newest version under a newer name; `nudge` adds noise to its weights, so that
    the new version answers differently from the old one."""
    src = latest_versions(root)[name]
    dst = src.parent / version
    shutil.copytree(src, dst)
    if nudge:
        ckpt = torch.load(dst / "model.pt", weights_only=True)
        gen = torch.Generator().manual_seed(0)
        ckpt["state_dict"] = {
            k: v + nudge * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
            for k, v in ckpt["state_dict"].items()
        }
        torch.save(ckpt, dst / "model.pt")
    return dst


def test_admin_needs_the_key(tiny_artifacts: Path, tmp_path: Path) -> None:
    root = _root(tiny_artifacts, tmp_path)
    with TestClient(create_app(Settings(artifacts_dir=root, device="cpu"))) as c:
        r = c.post("/admin/reload", headers=KEY)
        assert r.status_code == 403 and "disabled" in r.json()["error"]["message"]
    with TestClient(create_app(Settings(artifacts_dir=root, device="cpu", admin_api_key="s3cret"))) as c:
        assert c.post("/admin/reload").status_code == 401
        assert c.post("/admin/reload", headers={"X-API-Key": "nope"}).status_code == 403
        r = c.post("/admin/reload", headers=KEY)
        assert (
            r.status_code == 200
            and r.json()["loaded"] == {}
            and set(r.json()["unchanged"]) == {"sasrec-tiny", "bert4rec-tiny"}
        )


def test_empty_keys_from_the_environment_are_no_keys(
    tiny_artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docker-compose.yml passes `${SEQSERVE_ADMIN_API_KEY:-}`: an empty key must leave admin off (an
    # empty X-API-Key header would otherwise match it) and /events open, as with no variable at all.
    monkeypatch.setenv("SEQSERVE_ADMIN_API_KEY", "")
    monkeypatch.setenv("SEQSERVE_EVENTS_API_KEY", "")
    settings = Settings(artifacts_dir=_root(tiny_artifacts, tmp_path), device="cpu")
    assert settings.admin_api_key is None and settings.events_api_key is None
    assert Settings(admin_api_key=" ", events_api_key="").admin_api_key is None
    with TestClient(create_app(settings)) as c:
        r = c.post("/admin/reload", headers={"X-API-Key": ""})
        assert r.status_code == 403 and "disabled" in r.json()["error"]["message"]
        r = c.post(
            "/events",
            json={
                "model": "sasrec-tiny",
                "events": [{"event_id": "k1", "user_id": "u1", "item_id": "12", "timestamp": 1.5e9}],
            },
        )
        assert r.status_code == 200, r.text
    with TestClient(create_app(Settings(artifacts_dir=settings.artifacts_dir, device="cpu", events_api_key="w"))) as c:
        r = c.post(
            "/events",
            headers={"X-API-Key": ""},
            json={
                "model": "sasrec-tiny",
                "events": [{"event_id": "k2", "user_id": "u1", "item_id": "12", "timestamp": 1.5e9}],
            },
        )
        assert r.status_code == 401


def test_new_version_swaps_in_and_broken_one_keeps_the_old(tiny_artifacts: Path, tmp_path: Path) -> None:
    root = _root(tiny_artifacts, tmp_path)
    query = {"model": "sasrec-tiny", "queries": [{"user_id": "u1", "k": 5}]}
    with TestClient(create_app(Settings(artifacts_dir=root, device="cpu", admin_api_key="s3cret"))) as c:
        before = c.post("/recommend", json=query).json()
        old_bert = {m["name"]: m for m in c.get("/models").json()["models"]}["bert4rec-tiny"]["version"]
        _new_version(root, "sasrec-tiny", "29990101T000000Z", nudge=0.5)
        r = c.post("/admin/reload", headers=KEY).json()
        assert r["loaded"] == {"sasrec-tiny": "29990101T000000Z"}
        after = c.post("/recommend", json=query).json()
        assert after["version"] == "29990101T000000Z"
        assert before["results"][0]["items"] != after["results"][0]["items"]  # the new weights answer

        bad = _new_version(root, "bert4rec-tiny", "29990101T000000Z")
        (bad / "model.pt").write_bytes(b"truncated")
        r = c.post("/admin/reload", headers=KEY).json()
        assert r["failed"] == {"bert4rec-tiny/29990101T000000Z": "model.pt: unreadable checkpoint"}
        ok = c.post("/recommend", json={"model": "bert4rec-tiny", "queries": [{"user_id": "u1"}]})
        assert ok.status_code == 200 and ok.json()["version"] == old_bert  # the old version keeps serving
        assert c.get("/readyz").json()["broken"] == {
            "bert4rec-tiny/29990101T000000Z": "model.pt: unreadable checkpoint"
        }


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
                        r = await c.post(
                            "/recommend", json={"model": "sasrec-tiny", "queries": [{"user_id": f"u{(i + j) % 40}"}]}
                        )
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


def test_a_request_keeps_its_model_version_through_a_reload(tiny_artifacts: Path, tmp_path: Path) -> None:
    """A request that leased a model and waits on the store (Redis reads go to a thread) is answered by
    that version; the reload retires the old batcher only once the request is done with it."""
    import threading

    root = _root(tiny_artifacts, tmp_path)
    app = create_app(Settings(artifacts_dir=root, device="cpu", admin_api_key="s3cret"))

    async def go() -> None:
        async with app.router.lifespan_context(app):
            services = app.state.services
            store, gate = services.histories, threading.Event()
            real = store.events

            def slow_events(namespace: str, users: list[str], limit: int | None = None) -> object:
                gate.wait(5)
                return real(namespace, users, limit)

            store.events, store.local_reads = slow_events, False
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                req = asyncio.create_task(
                    c.post("/recommend", json={"model": "sasrec-tiny", "queries": [{"user_id": "u1"}]})
                )
                old = services.loaded.models["sasrec-tiny"]
                await wait_until_async(lambda: old.holders == 1)  # leased, waiting on the store
                _new_version(root, "sasrec-tiny", "29990101T000000Z")
                reload = asyncio.create_task(c.post("/admin/reload", headers=KEY))
                await wait_until_async(  # swapped in
                    lambda: services.loaded.models["sasrec-tiny"].version == "29990101T000000Z"
                )
                assert not old.batcher.stopped  # but the old one still owes an answer
                gate.set()
                r, rr = await req, await reload
                assert r.status_code == 200 and r.json()["version"] == old.version
                assert rr.json()["loaded"] == {"sasrec-tiny": "29990101T000000Z"} and old.batcher.stopped

    asyncio.run(go())


@pytest.mark.slow
def test_one_reload_reaches_every_worker(tiny_artifacts: Path, tmp_path: Path) -> None:
    """SEQSERVE_WORKERS=2: one POST /admin/reload, then every answer, whichever worker gives it, is new."""
    from tests.servers import start_api, stop, wait_until

    root = _root(tiny_artifacts, tmp_path)
    env = {
        "SEQSERVE_WORKERS": "2",
        "SEQSERVE_ADMIN_API_KEY": "s3cret",
        "SEQSERVE_STATE_DIR": str(tmp_path / "state"),
        "SEQSERVE_HOUSEKEEPING_S": "0.2",
    }
    proc, url = start_api(root, env)
    try:
        with httpx.Client(base_url=url, timeout=30) as c:
            # /readyz answered from one worker; the other may still be loading its models. Each worker
            # reports once loaded, so wait (on a slow machine, seconds) until both have.
            wait_until(lambda: len(c.post("/admin/reload", headers=KEY).json()["workers"]) == 2, timeout=90)
            _new_version(root, "sasrec-tiny", "29990101T000000Z", nudge=0.5)
            r = c.post("/admin/reload", headers=KEY).json()
            assert r["all_workers"] and len(r["workers"]) == 2
            assert {w["sasrec-tiny"] for w in r["workers"].values()} == {"29990101T000000Z"}
        versions = set()
        for _ in range(20):  # new connections: the kernel spreads them over both workers
            with httpx.Client(base_url=url, timeout=30) as c:
                versions.add(
                    c.post("/recommend", json={"model": "sasrec-tiny", "queries": [{"user_id": "u1"}]}).json()[
                        "version"
                    ]
                )
        assert versions == {"29990101T000000Z"}
    finally:
        stop(proc)


def test_a_reload_asked_of_one_host_reaches_another_on_the_same_store(tiny_artifacts: Path, tmp_path: Path) -> None:
    """Two hosts (their own reload state, as containers behind a balancer have) on one store: a reload
    reaches the host that took the call at once and the other on its next housekeeping tick."""
    root = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, root)
    old = latest_versions(root)["sasrec-tiny"]

    def host(n: int) -> Settings:
        return Settings(
            artifacts_dir=root,
            device="cpu",
            admin_api_key="k",
            history_path=tmp_path / "shared.sqlite3",
            state_dir=tmp_path / f"host{n}",
            housekeeping_s=0.05,
        )

    def version(c: TestClient) -> str:
        return {m["name"]: m["version"] for m in c.get("/models").json()["models"]}["sasrec-tiny"]

    with TestClient(create_app(host(1))) as a, TestClient(create_app(host(2))) as b:
        assert version(a) == version(b) == old.name
        shutil.copytree(old, old.parent / NEWER)
        assert a.post("/admin/reload", headers={"x-api-key": "k"}).status_code == 200
        assert version(a) == NEWER
        wait_until(lambda: version(b) == NEWER, timeout=10)
