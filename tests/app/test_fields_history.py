"""Item fields in answers, GET /history, the offline docs and the console page, through the real app."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.artifact import ITEM_FIELDS, latest_versions
from tests.conftest import stored


@pytest.fixture(scope="module")
def client(tiny_artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    state = tmp_path_factory.mktemp("state")
    app = create_app(
        Settings(
            artifacts_dir=tiny_artifacts,
            device="cpu",
            default_model="sasrec-tiny",
            history_path=state / "history.sqlite3",
            state_dir=state,
        )
    )
    with TestClient(app) as c:
        yield c


def _recommend(client: TestClient, query: dict[str, object], model: str = "sasrec-tiny") -> tuple[int, dict]:
    r = client.post("/recommend", json={"model": model, "queries": [query]})
    return r.status_code, r.json()


def test_models_list_their_fields(client: TestClient) -> None:
    models = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert models["sasrec-tiny"]["fields"] == ["genres", "release_year", "title"]


def test_fields_come_with_each_item_when_asked(client: TestClient) -> None:
    status, plain = _recommend(client, {"user_id": "u3", "k": 5})
    assert status == 200 and all("fields" not in i for i in plain["results"][0]["items"])  # unchanged by default
    status, body = _recommend(client, {"user_id": "u3", "k": 5, "fields": ["title", "genres", "release_year"]})
    assert status == 200
    items = body["results"][0]["items"]
    assert [i["item_id"] for i in items] == [i["item_id"] for i in plain["results"][0]["items"]]
    for it in items:
        n = int(it["item_id"])
        assert it["fields"] == {
            "title": f"Item {n}",
            "genres": [f"Genre{n % 3}", f"Genre{3 + n % 2}"],
            "release_year": 1990 + n % 10,
        }


@pytest.mark.parametrize(
    ("fields", "loc", "needle"),
    [
        (["title", "colour"], ["body", "queries", 0, "fields", 1], "unknown field 'colour'"),
        (["bad name"], ["body", "queries", 0, "fields", 0], "pattern"),
        ([f"f{i}" for i in range(17)], ["body", "queries", 0, "fields"], "at most 16"),
    ],
)
def test_bad_fields_are_422_naming_them(client: TestClient, fields: list[str], loc: list, needle: str) -> None:
    status, body = _recommend(client, {"user_id": "u3", "fields": fields})
    assert status == 422
    detail = body["error"]["details"][0]
    assert detail["loc"] == loc and needle in detail["msg"]


def test_history_is_newest_first_with_fields_and_live_events(client: TestClient, tiny_artifacts: Path) -> None:
    art_steps = stored(_artifact(tiny_artifacts), "u5")
    r = client.get("/history", params={"user_id": "u5", "fields": ["title"], "limit": 100})
    assert r.status_code == 200
    events = r.json()["events"]
    assert [e["item_id"] for e in events] == [i for i, _, _ in reversed(art_steps)]
    assert all(e["source"] == "artifact" and e["known"] for e in events)
    assert all(e["fields"] == {"title": f"Item {e['item_id']}"} for e in events)
    # An event of an item the model does not know is stored and shown first, flagged.
    t = max(ts for _, ts, _ in art_steps) + 60
    posted = client.post(
        "/events",
        json={
            "model": "sasrec-tiny",
            "events": [{"event_id": "h1", "user_id": "u5", "item_id": "new-9", "timestamp": t}],
        },
    )
    assert posted.status_code == 200 and posted.json()["results"][0]["unknown_item"] is True
    first = client.get("/history", params={"user_id": "u5", "limit": 2, "fields": ["title"]}).json()["events"]
    assert len(first) == 2
    assert first[0] == {
        "item_id": "new-9",
        "timestamp": t,
        "action": None,
        "source": "live",
        "known": False,
        "fields": {},
    }
    assert first[1]["item_id"] == art_steps[-1][0] and "fields" in first[1]


@pytest.mark.parametrize(
    ("params", "status", "loc"),
    [
        ({"user_id": "nobody"}, 404, ["query", "user_id"]),
        ({"user_id": "u5", "fields": ["colour"]}, 422, ["query", "fields", 0]),
        ({"user_id": "u5", "fields": ["title", "title", "colour"]}, 422, ["query", "fields", 2]),
        ({"user_id": "u5", "limit": 0}, 422, ["query", "limit"]),
        ({"user_id": "u5", "model": "nope"}, 404, ["query", "model"]),
        ({}, 422, ["query", "user_id"]),
    ],
)
def test_history_errors_name_the_parameter(client: TestClient, params: dict, status: int, loc: list) -> None:
    r = client.get("/history", params=params)
    assert r.status_code == status
    assert r.json()["error"]["details"][0]["loc"] == loc


def test_history_needs_the_events_key_when_set(tiny_artifacts: Path) -> None:
    app = create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu", events_api_key="s3cret-key"))
    with TestClient(app) as c:
        assert c.get("/history", params={"user_id": "u5", "model": "sasrec-tiny"}).status_code == 401
        bad = c.get("/history", params={"user_id": "u5", "model": "sasrec-tiny"}, headers={"X-API-Key": "wrong"})
        assert bad.status_code == 403
        ok = c.get("/history", params={"user_id": "u5", "model": "sasrec-tiny"}, headers={"X-API-Key": "s3cret-key"})
        assert ok.status_code == 200 and ok.json()["events"]


def test_social_and_location_models_have_no_item_fields(
    tiny_social_artifact: Path, tiny_location_artifact: Path, tmp_path: Path
) -> None:
    shutil.copytree(tiny_social_artifact, tmp_path, dirs_exist_ok=True)
    shutil.copytree(tiny_location_artifact / "mhsa-tiny", tmp_path / "mhsa-tiny")
    with TestClient(create_app(Settings(artifacts_dir=tmp_path, device="cpu"))) as c:
        models = c.get("/models").json()["models"]
        assert {m["task"] for m in models} == {"social", "next_location"}
        assert all(m["fields"] == [] for m in models)
        social = next(m["name"] for m in models if m["task"] == "social")
        r = c.post("/recommend", json={"model": social, "queries": [{"user_id": "s1", "fields": ["title"]}]})
        assert r.status_code == 422 and "no item fields" in r.json()["error"]["details"][0]["msg"]


def test_artifact_without_fields_still_loads_and_a_bad_one_is_broken(tiny_artifacts: Path, tmp_path: Path) -> None:
    for name in ("sasrec-tiny", "bert4rec-tiny"):
        shutil.copytree(tiny_artifacts / name, tmp_path / name)
    (latest_versions(tmp_path)["sasrec-tiny"] / ITEM_FIELDS).unlink()  # an artifact from before fields
    (latest_versions(tmp_path)["bert4rec-tiny"] / ITEM_FIELDS).write_text(json.dumps({"fields": {"title": [1]}}))
    with TestClient(create_app(Settings(artifacts_dir=tmp_path, device="cpu"))) as c:
        ready = c.get("/readyz").json()
        assert ready["models"] == ["sasrec-tiny"]
        assert any(ITEM_FIELDS in why for why in ready["broken"].values())
        r = c.post("/recommend", json={"queries": [{"user_id": "u3", "fields": ["title"]}]})
        assert r.status_code == 422 and "this model has no item fields" in r.json()["error"]["message"]


def test_docs_page_loads_nothing_from_another_host(client: TestClient) -> None:
    html = client.get("/docs").text
    urls = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert urls and all(u.startswith("/") for u in urls), urls
    assert "http" not in html.replace("http-equiv", "")
    for u in urls:
        assert client.get(u).status_code == 200, u
    assert client.get("/redoc").status_code == 404  # its bundle fetches a logo from a CDN: not served


def test_a_duplicated_field_is_named_at_its_own_index(client: TestClient) -> None:
    code, body = _recommend(client, {"user_id": "u5", "fields": ["title", "title", "colour"]})
    assert code == 422 and body["error"]["details"][0]["loc"] == ["body", "queries", 0, "fields", 2]
    code, body = _recommend(client, {"user_id": "u5", "fields": ["title", "title"]})
    assert code == 200 and all(set(i["fields"]) == {"title"} for i in body["results"][0]["items"])


def test_console_page_and_its_switch(client: TestClient, tiny_artifacts: Path) -> None:
    page = client.get("/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    # The same page through the assets path carries the same headers.
    same = client.get("/console/assets/index.html")
    assert (
        same.status_code == 200 and same.headers["content-security-policy"] == page.headers["content-security-policy"]
    )
    assert same.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in client.get("/console/assets/console.js").headers["content-security-policy"]
    assert "/console" not in client.get("/openapi.json").json()["paths"]
    for asset in ("console.js", "console.css"):
        assert client.get(f"/console/assets/{asset}").status_code == 200
    assert "http" not in client.get("/console/assets/console.js").text
    off = create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu", console=False))
    with TestClient(off) as c:
        assert c.get("/console").status_code == 404 and c.get("/console/assets/console.js").status_code == 404


def _artifact(root: Path) -> object:
    from models.tasks.recommend import load_artifact

    return load_artifact(latest_versions(root)["sasrec-tiny"])
