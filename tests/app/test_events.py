"""POST /events through the real app: durable appends that the next /recommend sees."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.artifact import latest_versions
from models.tasks.recommend import load_artifact as load_rec_artifact
from tests.conftest import stored

Y2005 = dt.datetime(2005, 6, 1, tzinfo=dt.UTC).timestamp()


@pytest.fixture
def client(tiny_artifacts: Path) -> Iterator[TestClient]:
    app = create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu", default_model="sasrec-tiny", max_events=20))
    with TestClient(app) as c:
        yield c


def _rec(client: TestClient, user: str, k: int = 5, model: str = "sasrec-tiny") -> dict:
    r = client.post("/recommend", json={"model": model, "queries": [{"user_id": user, "k": k}]})
    assert r.status_code == 200, r.text
    return dict(r.json()["results"][0])


def test_new_events_are_excluded_as_seen_at_once(client: TestClient, tiny_artifacts: Path) -> None:
    before = _rec(client, "u3")
    top = [i["item_id"] for i in before["items"][:3]]
    art = load_rec_artifact(latest_versions(tiny_artifacts)["sasrec-tiny"])
    t_last = max(t for _, t, _ in stored(art, "u3"))
    events = [
        {"event_id": f"u3-{n}", "user_id": "u3", "item_id": i, "timestamp": t_last + 60 * (n + 1)}
        for n, i in enumerate(top)
    ]
    r = client.post("/events", json={"events": events})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["stored"], body["duplicates"], body["rejected"]) == (3, 0, 0)
    assert body["model"] == "sasrec-tiny" and body["namespace"]
    assert [e["status"] for e in body["results"]] == ["stored"] * 3
    after = _rec(client, "u3")
    assert not set(top) & {i["item_id"] for i in after["items"]}
    assert after["excluded"]["seen"] == before["excluded"]["seen"] + 3
    assert after["items"] != before["items"]

    # Replaying the same events is a no-op.
    again = client.post("/events", json={"events": events}).json()
    assert (again["stored"], again["duplicates"]) == (0, 3)
    assert _rec(client, "u3")["excluded"]["seen"] == after["excluded"]["seen"]


def test_event_time_moves_the_future_cut(client: TestClient) -> None:
    results = {u: _rec(client, u, k=30) for u in (f"u{n}" for n in range(40))}
    user, before = next((u, r) for u, r in results.items() if r["excluded"]["future"])
    r = client.post(
        "/events", json={"events": [{"event_id": "late", "user_id": user, "item_id": "10", "timestamp": Y2005}]}
    )
    assert r.status_code == 200
    after = _rec(client, user, k=30)
    # Released 1990..1999: nothing is in the future of a 2005 interaction.
    assert before["excluded"]["future"] > 0 and after["excluded"]["future"] == 0
    assert len(after["items"]) > len(before["items"])


def test_unknown_item_is_stored_and_flagged_to_the_writer_only(client: TestClient) -> None:
    r = client.post(
        "/events", json={"events": [{"event_id": "x1", "user_id": "u7", "item_id": "brand-new", "timestamp": Y2005}]}
    )
    assert r.status_code == 200
    assert r.json()["results"][0] == {
        "index": 0,
        "event_id": "x1",
        "status": "stored",
        "unknown_item": True,
        "errors": [],
    }
    # The writer learns it here; an answer never echoes a stored id (docs/decisions/private-histories.md).
    assert _rec(client, "u7")["unknown_items"] == []


def test_a_new_user_is_served_from_events(client: TestClient) -> None:
    r = client.post("/recommend", json={"queries": [{"user_id": "newcomer"}]})
    assert r.status_code == 200 and r.json()["results"][0]["source"] == "popular"  # the fallback, until it acts
    client.post(
        "/events", json={"events": [{"event_id": "n1", "user_id": "newcomer", "item_id": "12", "timestamp": Y2005}]}
    )
    res = _rec(client, "newcomer")
    assert len(res["items"]) == 5 and "12" not in {i["item_id"] for i in res["items"]}
    assert res["source"] == "model"


def test_a_late_event_is_rejected_alone_a_malformed_one_refuses_the_request(client: TestClient) -> None:
    late = time.time() + 3600
    events = [
        {"event_id": "ok1", "user_id": "u1", "item_id": "12", "timestamp": Y2005},
        {"event_id": "late1", "user_id": "u1", "item_id": "12", "timestamp": late},
        {"event_id": "ok2", "user_id": "u1", "item_id": "13", "timestamp": Y2005},
    ]
    r = client.post("/events", json={"events": events})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["stored"], body["rejected"]) == (2, 1)
    res = body["results"]
    assert [e["status"] for e in res] == ["stored", "rejected", "stored"]
    assert res[1]["event_id"] == "late1" and res[1]["errors"][0]["loc"] == ["body", "events", 1, "timestamp"]
    # Only late events: nothing stored, each one says why, and the request itself was well formed.
    r = client.post("/events", json={"events": [{**events[1], "event_id": "late2"}]})
    assert r.status_code == 200 and (r.json()["stored"], r.json()["rejected"]) == (0, 1)

    malformed = [
        {"event_id": "ok3", "user_id": "u1", "item_id": "12", "timestamp": Y2005},
        {"event_id": "bad1", "user_id": "u1", "item_id": "12"},
        {"event_id": "bad2", "user_id": "u1", "item_id": "12", "timestamp": -5},
        {"event_id": "bad3", "user_id": "u1", "item_id": "12", "timestamp": Y2005, "rating": 5},
        {"user_id": "u1", "item_id": "13", "timestamp": Y2005},
        None,
    ]
    r = client.post("/events", json={"events": malformed})
    assert r.status_code == 422, r.text
    locs = {tuple(d["loc"]) for d in r.json()["error"]["details"]}
    assert locs == {
        ("body", "events", 1, "timestamp"),
        ("body", "events", 2, "timestamp"),
        ("body", "events", 3, "rating"),
        ("body", "events", 4, "event_id"),
        ("body", "events", 5),
    }
    r = client.post("/events", json={"events": malformed[:1]})  # nothing of the refused request was stored
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "stored"


def test_ids_that_are_not_utf8_are_rejected_not_500(client: TestClient) -> None:
    body = (
        '{"events": [{"event_id": "\\ud800", "user_id": "u1", "item_id": "12", "timestamp": 1},'
        ' {"event_id": "ok", "user_id": "u1", "item_id": "\\udfff", "timestamp": 1},'
        ' {"event_id": "fine", "user_id": "u1", "item_id": "12", "timestamp": 1}]}'
    )
    # Lone surrogates are JSON escapes that encode no text: the body is refused whole, naming where.
    r = client.post("/events", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_request" and "column 33" in r.json()["error"]["message"]


def test_malformed_is_422_and_limits_hold(client: TestClient) -> None:
    r = client.post("/events", json={"events": [{"event_id": "e", "user_id": "u1"}, "junk"]})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "invalid_request"
    assert {tuple(d["loc"][:3]) for d in err["details"]} == {("body", "events", 0), ("body", "events", 1)}
    many = [{"event_id": f"e{n}", "user_id": "u1", "item_id": "12", "timestamp": 1.0} for n in range(21)]
    r = client.post("/events", json={"events": many})
    assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == ["body", "events"]
    assert client.post("/events", json={"events": []}).status_code == 422
    r = client.post("/events", json={"model": "nope", "events": many[:1]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model"


def test_store_down_answers_503_and_readyz_says_why(tiny_artifacts: Path) -> None:
    from tests.servers import free_port

    settings = Settings(
        artifacts_dir=tiny_artifacts,
        device="cpu",
        history_store="redis",
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
    )
    with TestClient(create_app(settings)) as c:
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["history_store"].startswith("redis: ")
        ev = {"event_id": "e", "user_id": "u1", "item_id": "12", "timestamp": 1.0}
        r = c.post("/events", json={"events": [ev]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
        assert c.post("/recommend", json={"queries": [{"user_id": "u1"}]}).status_code == 503
        # A query that brings its own history does not need the store.
        r = c.post("/recommend", json={"queries": [{"history": [{"item_id": "12"}]}]})
        assert r.status_code == 200


def test_namespace_is_the_model_name_without_a_data_set_name(tiny_artifacts: Path) -> None:
    """The tiny models name no data set, so each keeps its own histories."""
    with TestClient(create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu"))) as c:
        client_events = {"events": [{"event_id": "s1", "user_id": "u2", "item_id": "12", "timestamp": Y2005}]}
        assert c.post("/events", json={"model": "sasrec-tiny", **client_events}).json()["namespace"] == "sasrec-tiny"
        b = c.post("/events", json={"model": "bert4rec-tiny", **client_events}).json()
        assert b["namespace"] == "bert4rec-tiny" and b["stored"] == 1


def test_an_event_older_than_the_kept_window_is_reported_dropped(tiny_artifacts: Path) -> None:
    app = create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu", default_model="sasrec-tiny", live_events=5))
    with TestClient(app) as c:
        recent = [{"event_id": f"n{n}", "user_id": "w1", "item_id": "12", "timestamp": Y2005 + n} for n in range(5)]
        assert c.post("/events", json={"events": recent}).json()["stored"] == 5
        old = {"event_id": "old", "user_id": "w1", "item_id": "13", "timestamp": 1}
        out = c.post("/events", json={"events": [old, {**old, "event_id": "new", "timestamp": Y2005 + 9}]}).json()
        assert [r["status"] for r in out["results"]] == ["dropped_old", "stored"]
        assert out["stored"] == 1 and out["dropped_old"] == 1
        again = c.post("/events", json={"events": [old]}).json()  # its id is still known
        assert again["results"][0]["status"] == "duplicate"


def test_a_blank_id_is_refused_naming_its_field(client: TestClient) -> None:
    ok = {"event_id": "b0", "user_id": "u1", "item_id": "12", "timestamp": 1.0}
    for field_name, blank in (("user_id", "   "), ("item_id", "\t"), ("action", " "), ("event_id", " ")):
        r = client.post("/events", json={"events": [ok, {**ok, "event_id": "b1", field_name: blank}]})
        assert r.status_code == 422, (field_name, r.text)
        assert r.json()["error"]["details"][0]["loc"] == ["body", "events", 1, field_name]
    assert client.post("/events", json={"events": [ok]}).json()["stored"] == 1  # nothing of the refused calls
