"""POST /next-location through the real app, on a tiny MHSA artifact."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

STEP = {"location_id": "home1", "start_min": 420, "weekday": 1, "duration_min": 600}


@pytest.fixture(scope="module")
def client(tiny_location_artifact: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(artifacts_dir=tiny_location_artifact, device="cpu"))) as c:
        yield c


def test_listed_and_ready(client: TestClient) -> None:
    models = client.get("/models").json()
    assert models["defaults"]["/next-location"] == "mhsa-tiny"
    info = next(m for m in models["models"] if m["name"] == "mhsa-tiny")
    assert info["task"] == "next_location" and info["kind"] == "mhsa" and info["scoring"] == "traced"
    assert info["route"] == "/next-location" and info["ranks"] == "locations" and info["exclude_seen_default"] is None
    assert "mhsa-tiny" in client.get("/readyz").json()["models"]


def test_probabilities_ranked_with_unknown_class(client: TestClient) -> None:
    body = {
        "queries": [{"user_id": "1", "history": [STEP, {**STEP, "location_id": "work1", "start_min": 540}], "k": 200}]
    }
    r = client.post("/next-location", json=body)
    assert r.status_code == 200, r.text
    res = r.json()["results"][0]
    probs = [x["probability"] for x in res["locations"]]
    assert probs == sorted(probs, reverse=True) and all(0 <= p <= 1 for p in probs)
    assert sum(probs) == pytest.approx(1.0, abs=1e-4)  # k beyond the classes: every class, padding never
    ids = [x["location_id"] for x in res["locations"]]
    assert None in ids and len(ids) == len(set(ids))  # the unknown class appears once, as null
    assert res["unknown_user"] is False and res["unknown_locations"] == []


def test_unknown_user_and_locations_and_iso_times(client: TestClient) -> None:
    step = {
        "location_id": "never-seen",
        "started_at": "2024-03-04T07:00:00+01:00",
        "finished_at": "2024-03-04T17:00:00+01:00",
    }
    r = client.post("/next-location", json={"queries": [{"user_id": "zz", "history": [step, STEP], "k": 3}]})
    assert r.status_code == 200, r.text
    res = r.json()["results"][0]
    assert res["unknown_user"] is True and res["unknown_locations"] == ["never-seen"]
    assert len(res["locations"]) == 3


def test_iso_times_equal_relative_fields(client: TestClient) -> None:
    # 2024-03-05 is a Tuesday (weekday 1): 07:00 for 600 minutes is exactly STEP.
    # The time of day is read in the stay's own offset.
    iso = {"location_id": "home1", "started_at": "2024-03-05T07:00:00+09:00", "finished_at": "2024-03-05T08:00:00Z"}
    a = client.post("/next-location", json={"queries": [{"user_id": "1", "history": [iso]}]}).json()
    b = client.post("/next-location", json={"queries": [{"user_id": "1", "history": [STEP]}]}).json()
    assert a["results"] == b["results"]


@pytest.mark.parametrize(
    ("query", "loc"),
    [
        ({"user_id": "1", "history": []}, ["body", "queries", 0, "history"]),
        ({"user_id": "1"}, ["body", "queries", 0, "history"]),
        ({"history": [{**STEP, "start_min": 1440}]}, ["body", "queries", 0, "history", 0, "start_min"]),
        ({"history": [{**STEP, "weekday": 7}]}, ["body", "queries", 0, "history", 0, "weekday"]),
        ({"history": [{"location_id": "a", "start_min": 3}]}, ["body", "queries", 0, "history", 0]),
        (
            {"history": [{"location_id": "a", "started_at": "yesterday", "finished_at": "2024-01-01T00:00:00Z"}]},
            ["body", "queries", 0, "history", 0, "started_at"],
        ),
        # Unix seconds as text and times without an offset are not RFC 3339 date-times.
        (
            {"history": [{"location_id": "a", "started_at": "0", "finished_at": "2024-01-01T00:00:00Z"}]},
            ["body", "queries", 0, "history", 0, "started_at"],
        ),
        (
            {
                "history": [
                    {"location_id": "a", "started_at": "2024-01-01T00:00:00Z", "finished_at": "2024-01-01T01:00:00"}
                ]
            },
            ["body", "queries", 0, "history", 0, "finished_at"],
        ),
        (
            {
                "history": [
                    {"location_id": "a", "started_at": "2024-01-02T00:00:00Z", "finished_at": "2024-01-01T00:00:00Z"}
                ]
            },
            ["body", "queries", 0, "history", 0],
        ),
    ],
)
def test_bad_history_is_422_naming_the_field(client: TestClient, query: dict, loc: list) -> None:
    r = client.post("/next-location", json={"queries": [query]})
    assert r.status_code == 422
    assert r.json()["error"]["details"][0]["loc"][: len(loc)] == loc


def test_unknown_model(client: TestClient) -> None:
    r = client.post("/next-location", json={"model": "sasrec-tiny", "queries": [{"history": [STEP]}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model"
