"""The benches' own servers: the no-op the load benchmark measures the request path's ceiling with, and
the LitServe peer's use of the engine."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from models.artifact import latest_versions


def _bench_module(name: str) -> ModuleType:
    return importlib.import_module(f"bench.serving.{name}")


def test_noop_parses_and_answers_like_recommend(tiny_artifacts: Path) -> None:
    """The load bench's no-op validates the same body and answers the same shape, without a model."""
    noop = _bench_module("noop")
    with TestClient(noop.create_with(Settings(artifacts_dir=tiny_artifacts, device="cpu", max_queries=8))) as c:
        paths = [getattr(r, "path", None) for r in c.app.router.routes]  # type: ignore[attr-defined]
        assert paths.index("/bench/noop") == paths.index("/recommend") + 1  # the same route walk
        r = c.post("/bench/noop", json={"queries": [{"user_id": "u1", "k": 3}, {"history": [{"item_id": "12"}]}]})
        assert r.status_code == 200 and r.headers["x-request-id"]
        real = c.post("/recommend", json={"queries": [{"user_id": "u1", "k": 3}]}).json()
        got = r.json()
        assert set(got) == set(real) and set(got["results"][0]) == set(real["results"][0])
        assert [len(res["items"]) for res in got["results"]] == [3, 10]
        r = c.post("/bench/noop", json={"queries": [{"user_id": "u1"}] * 9})
        assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == ["body", "queries"]
        assert "/bench/noop" not in c.get("/openapi.json").json()["paths"]
        metrics = c.get("/metrics").text
        assert 'seqserve_requests_total{endpoint="/bench/noop",model="-",status="422"} 1.0' in metrics


def test_the_litserve_peer_answers_through_the_project_s_engine(
    tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/serving/litserve_server.py's API class on the tiny artifact, with a stand-in for LitServe's base class
    (litserve is the `bench` extra, not installed for tests): what rots when this project's engine
    changes is checked here; LitServe's own side is exercised only by a run of the bench."""
    stub = ModuleType("litserve")

    class LitAPI:
        def __init__(self, api_path: str = "/predict", **_: object) -> None:
            self.api_path = api_path

    stub.LitAPI = LitAPI  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "litserve", stub)
    peer = _bench_module("litserve_server")
    api = peer.RecommendAPI(latest_versions(tiny_artifacts)["sasrec-tiny"], torch_threads=1, max_batch_size=4)
    api.setup("cpu")
    queries = [
        api.decode_request({"queries": [{"user_id": "u3", "k": 4}]}),
        api.decode_request({"queries": [{"user_id": "u1"}]}),
    ]
    answers = [api.encode_response(r) for r in api.predict(queries)]
    assert api.api_path == "/recommend"
    assert [len(a["results"][0]["items"]) for a in answers] == [4, 10]
    assert [a["results"][0]["user_id"] for a in answers] == ["u3", "u1"]


def test_free_ports_do_not_follow_the_seeded_global_random() -> None:
    """A training job seeds `random` (seed_everything): two test workers that each trained a model must
    still draw different ports, or one starts its server on the other's."""
    import random

    from bench.servers import free_port

    drawn = []
    for _ in range(3):
        random.seed(42)
        drawn.append(free_port())
    assert len(set(drawn)) > 1, drawn
