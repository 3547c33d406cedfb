"""The benches' own endpoint: the no-op the load benchmark measures the request path's ceiling with."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from fastapi.testclient import TestClient

from app.settings import Settings
from tests.servers import ROOT


def _bench_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
