"""The service on a CUDA device answers what it answers on the CPU, through the real app.

Skipped without CUDA (CI has none); run on a GPU machine, see docs/BENCHMARKS.md.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

STEP = {"location_id": "home1", "start_min": 420, "weekday": 1, "duration_min": 600}
REQUESTS = [
    (
        "/recommend",
        {
            "model": "sasrec-tiny",
            "queries": [{"user_id": "u3", "k": 5}, {"history": [{"item_id": "12"}, {"item_id": "13"}]}],
        },
    ),
    ("/recommend", {"model": "bert4rec-tiny", "queries": [{"user_id": "u3", "k": 5}]}),
    ("/recommend", {"model": "social-tiny", "queries": [{"user_id": "s3", "k": 5, "exclude_seen": True}]}),
    ("/next-location", {"queries": [{"user_id": "1", "history": [STEP, {**STEP, "location_id": "work1"}], "k": 5}]}),
]


@pytest.fixture(scope="module")
def root(tiny_location_artifact: Path, tiny_social_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("all-kinds")
    for src in (tiny_location_artifact, tiny_social_artifact):
        shutil.copytree(src, r, dirs_exist_ok=True)
    return r


def _answers(root: Path, **settings: object) -> tuple[list[list[dict]], dict]:
    with TestClient(create_app(Settings(artifacts_dir=root, **settings))) as c:  # type: ignore[arg-type]
        out = []
        for path, body in REQUESTS:
            r = c.post(path, json=body)
            assert r.status_code == 200, r.text
            out.append(r.json()["results"])
        return out, c.get("/models").json()


def _ranked(results: list[dict]) -> list[list[tuple[str | None, float]]]:
    """Per query, (id, score) best first: items and scores, or places and probabilities."""
    if "locations" in results[0]:
        return [[(x["location_id"], x["probability"]) for x in r["locations"]] for r in results]
    return [[(x["item_id"], x["score"]) for x in r["items"]] for r in results]


@pytest.mark.parametrize("half", [False, True])
def test_every_kind_answers_on_cuda_as_on_the_cpu(root: Path, half: bool) -> None:
    cpu, _ = _answers(root, device="cpu")
    gpu, models = _answers(root, device="cuda", half_precision=half)
    assert all(m["device"].startswith("cuda") for m in models["models"])
    tol = 2e-2 if half else 1e-4
    for want, got in zip(cpu, gpu, strict=True):
        for a, b in zip(_ranked(want), _ranked(got), strict=True):
            assert len(a) == len(b)
            assert [s for _, s in b] == pytest.approx([s for _, s in a], abs=tol, rel=tol)
            if not half:  # fp16 may swap near-ties; fp32 must not
                assert [i for i, _ in b] == [i for i, _ in a]
        # What was excluded, and why, does not depend on the device.
        assert [r.get("excluded") for r in want] == [r.get("excluded") for r in got]
