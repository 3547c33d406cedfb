"""A task is one registered row: registering the toy task (tests/models/toy_task.py) gives it a model
kind, a CLI command and job, a route with its OpenAPI entries and a default model, editing nothing
else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.routers.tasks import ROUTES
from app.settings import Settings
from models.kinds import MODEL_KINDS
from models.tasks import TASKS, register
from tests.models import toy_task
from training.__main__ import main
from training.jobs import JOBS, DefaultRun, job_class

CONFIG = """name = "toy-cycle"
[model]
kind = "toy"
[data]
n_tokens = 12
[train]
epochs = 200
batch_size = 12
lr = 0.05
patience = 200
"""


@pytest.fixture
def tables() -> Iterator[None]:
    """The task table and model kinds as they were, after the test."""
    tasks, kinds = dict(TASKS), dict(MODEL_KINDS)
    yield
    toy_task.unregister_all()
    TASKS.clear()
    TASKS.update(tasks)
    MODEL_KINDS.clear()
    MODEL_KINDS.update(kinds)


@pytest.fixture
def toy(tables: None) -> None:
    toy_task.register_all()


def test_a_registered_task_trains_from_the_cli_and_is_served(toy: None, tmp_path: Path) -> None:
    assert MODEL_KINDS["toy"] == (toy_task.ToyConfig, toy_task.ToyModel)
    config = tmp_path / "toy.toml"
    config.write_text(CONFIG)
    arts = tmp_path / "artifacts"
    assert main(["toy-task", "--config", str(config), "--out", str(arts)]) == 0  # its own command
    assert main(["train", "--config", str(config), "--out", str(arts)]) == 0  # and the general one
    with TestClient(create_app(Settings(artifacts_dir=arts, device="cpu"))) as client:
        assert client.get("/readyz").json()["models"] == ["toy-cycle"]
        answer = client.post("/toy", json={"queries": [{"token": 3, "k": 2}, {"token": 11}]})
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert [r["next"][0] for r in results] == [4, 0]  # it learned the cycle
        bad = client.post("/toy", json={"queries": [{"token": 99}]})  # the engine's own check
        assert bad.status_code == 422 and bad.json()["error"]["details"][0]["loc"][-1] == "token"
        assert client.post("/toy", json={"queries": []}).status_code == 422  # the route's body model
        assert client.post("/recommend", json={"queries": [{"user_id": "u"}]}).status_code == 503
        # Every route the rows declare has a default: the toy model for its own, none where nothing loaded.
        paths = {ROUTES[t.route].path for t in TASKS.values() if t.route}
        assert "/toy" in paths and len(paths) > 1
        expected = {path: ("toy-cycle" if path == "/toy" else None) for path in paths}
        assert client.get("/models").json()["defaults"] == expected
        doc = client.get("/openapi.json").json()
        assert "post" in doc["paths"]["/toy"]
        assert {"ToyRequest", "ToyResponse"} <= set(doc["components"]["schemas"])


def test_without_its_row_the_task_is_nowhere(tmp_path: Path) -> None:
    assert "toy" not in TASKS and "toy" not in MODEL_KINDS
    with TestClient(create_app(Settings(artifacts_dir=tmp_path, device="cpu"))) as client:
        assert "/toy" not in client.get("/openapi.json").json()["paths"]
        assert client.post("/toy", json={"queries": [{"token": 3}]}).status_code == 404
    with pytest.raises(SystemExit):
        main(["toy-task"])


def test_a_row_cannot_take_another_task_s_name_or_model_kind() -> None:
    with pytest.raises(ValueError, match="registered already"):
        register(TASKS["recommend"])
    clash = toy_task.Task("toy", {"sasrec": (toy_task.ToyConfig, toy_task.ToyModel)})
    with pytest.raises(ValueError, match="another task"):
        register(clash)
    assert "toy" not in TASKS


def test_a_piece_without_its_row_or_a_row_without_its_piece_fails_loudly(tables: None, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no task 'toy'"):
        toy_task.register_job(toy_task.TaskJob(toy_task.ToyJob))
    register(toy_task.TASK)  # the row alone: no job, no route
    with pytest.raises(LookupError, match="no registered training job"):
        job_class(toy_task.TASK)
    with pytest.raises(LookupError, match="no module registered"):
        create_app(Settings(artifacts_dir=tmp_path, device="cpu"))


def test_defaults_trains_a_task_s_default_runs_whose_data_is_there(
    tables: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "toy.toml"
    config.write_text(CONFIG)
    toy_task.register_all(DefaultRun(str(config), "TOY_DATA", ("train.epochs=2",), what="the toy cycle"))
    assert JOBS["toy"].defaults[0].data_env == "TOY_DATA"
    arts = tmp_path / "artifacts"
    monkeypatch.setenv("TOY_DATA", str(tmp_path / "missing.csv"))
    assert main(["defaults", "--out", str(arts), "--task", "toy"]) == 0
    assert not arts.exists() and "TOY_DATA" in caplog.text  # skipped, and the log says how to point to it
    monkeypatch.delenv("TOY_DATA")
    assert main(["defaults", "--out", str(arts), "--task", "toy"]) == 0
    assert [p.name for p in arts.iterdir()] == ["toy-cycle"]
