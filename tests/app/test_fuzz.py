"""Property-based fuzzing of the request bodies: no input, however odd, gets a 5xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.main import create_app
from app.settings import Settings

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
IDS = st.sampled_from(["u1", "u2", "12", "13", "nope", "", "x" * 300, "\ud800", "a\x00b"]) | st.text(max_size=8)
NUMS = st.integers(-5, 3000) | st.floats(allow_nan=True, allow_infinity=True) | st.none() | st.text(max_size=3)
HISTORY_EVENT = st.fixed_dictionaries({"item_id": IDS}, optional={"timestamp": NUMS})
REC_QUERY = st.fixed_dictionaries(
    {},
    optional={
        "user_id": IDS | st.none(),
        "history": st.lists(HISTORY_EVENT, max_size=5) | st.none(),
        "k": NUMS,
        "exclude_seen": st.booleans() | NUMS,
        "exclude_future": st.booleans(),
        "exclude_items": st.lists(IDS, max_size=3),
        "as_of": NUMS,
    },
)
STAY = st.fixed_dictionaries(
    {"location_id": IDS},
    optional={
        "start_min": NUMS,
        "weekday": NUMS,
        "duration_min": NUMS,
        "started_at": st.sampled_from(["2024-01-01T10:00:00", "2024-01-01T10:00:00+05:00", "nope", ""]),
        "finished_at": st.sampled_from(["2024-01-01T12:00:00", "2023-01-01T00:00:00Z", "x"]),
    },
)
LOC_QUERY = st.fixed_dictionaries(
    {}, optional={"user_id": IDS | st.none(), "history": st.lists(STAY, max_size=4), "k": NUMS}
)
EVENT = (
    st.fixed_dictionaries(
        {},
        optional={
            "event_id": IDS | NUMS,
            "user_id": IDS | NUMS,
            "item_id": IDS | NUMS,
            "timestamp": NUMS,
            "extra": JSON,
        },
    )
    | JSON
)
HEADERS = {"content-type": "application/json"}


def post(client: TestClient, path: str, body: object):  # type: ignore[no-untyped-def]
    # json.dumps writes NaN and Infinity as bare words; Python's parser on the server accepts them.
    return client.post(path, content=json.dumps(body), headers=HEADERS)


MODELS = st.sampled_from(["sasrec-tiny", "bert4rec-tiny", "mhsa-tiny", "nope"]) | st.none()


@pytest.fixture(scope="module")
def client(tiny_location_artifact: Path) -> Iterator[TestClient]:
    app = create_app(Settings(artifacts_dir=tiny_location_artifact, device="cpu", max_queries=4, max_k=50))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(body=JSON)
def test_arbitrary_json_never_5xx(client: TestClient, body: object) -> None:
    for path in ("/recommend", "/next-location", "/events"):
        r = post(client, path, body)
        assert r.status_code < 500, r.text
        assert r.status_code == 200 or "error" in r.json()


@FUZZ
@given(model=MODELS, queries=st.lists(REC_QUERY, max_size=5))
def test_recommend_shaped_bodies_never_5xx(client: TestClient, model: str | None, queries: list) -> None:
    r = post(client, "/recommend", {"model": model, "queries": queries})
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert r.json()["error"]["code"]


@FUZZ
@given(model=MODELS, queries=st.lists(LOC_QUERY, max_size=5))
def test_next_location_shaped_bodies_never_5xx(client: TestClient, model: str | None, queries: list) -> None:
    r = post(client, "/next-location", {"model": model, "queries": queries})
    assert r.status_code < 500, r.text


@FUZZ
@given(raw=st.binary(max_size=200))
def test_raw_bytes_never_5xx(client: TestClient, raw: bytes) -> None:
    r = client.post("/recommend", content=raw, headers={"content-type": "application/json"})
    assert r.status_code < 500


@FUZZ
@given(model=MODELS, events=st.lists(EVENT, max_size=5))
def test_event_shaped_bodies_never_5xx(client: TestClient, model: str | None, events: list) -> None:
    r = post(client, "/events", {"model": model, "events": events})
    assert r.status_code < 500, r.text
    body = r.json()
    if r.status_code == 200:
        assert body["stored"] + body["duplicates"] + body["rejected"] == len(events)
    else:
        assert body["error"]["code"]
