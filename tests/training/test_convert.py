"""Artifacts written with histories.json: refused by the service with the command that converts them, and
once converted they answer every user exactly as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.artifact import latest_versions
from models.engine import EngineOptions
from models.tasks import TASKS
from models.tasks.recommend import RecQuery, UserQueryEngine
from tests.conftest import stored, stored_users
from training.__main__ import main
from training.convert import convert_root


def _answers(engine: UserQueryEngine, users: list[str]) -> list[object]:
    return [(r.items, r.excluded, r.history_truncated) for r in engine.answer([RecQuery(u, k=7) for u in users])]


def _open(folder: Path) -> UserQueryEngine:
    manifest = json.loads((folder / "manifest.json").read_text())
    engine = TASKS[manifest["task"]].open(folder, EngineOptions(trace=False))
    assert isinstance(engine, UserQueryEngine)
    return engine


def _to_old_layout(folder: Path, social: bool) -> None:
    """Rewrite a version as the earlier export wrote it: histories.json instead of the table."""
    art = TASKS["social" if social else "recommend"].load(folder, "cpu")  # type: ignore[misc]
    old = {u: [[i, t, a] if social else [i, t] for i, t, a in stored(art, u)] for u in stored_users(art)}
    (folder / "histories.json").write_text(json.dumps(old))
    shutil.rmtree(folder / "histories")


@pytest.mark.parametrize("name", ["sasrec-tiny", "social-tiny"])
def test_an_old_artifact_is_refused_then_converted_answers_alike(
    tiny_artifacts: Path, tiny_social_artifact: Path, tmp_path: Path, name: str
) -> None:
    src = tiny_social_artifact if name == "social-tiny" else tiny_artifacts
    root = tmp_path / "arts"
    shutil.copytree(latest_versions(src)[name].parent, root / name)
    folder = latest_versions(root)[name]
    before = _open(folder)
    users = sorted(before.stored_users())
    expected = _answers(before, users)
    _to_old_layout(folder, social=name == "social-tiny")

    with TestClient(create_app(Settings(artifacts_dir=root, device="cpu"))) as c:
        body = c.get("/readyz").json()
        reason = body["broken"][f"{name}/{folder.name}"]
        assert "histories.json" in reason and "python -m training convert-histories" in reason
        assert str(root) not in json.dumps(body)

    # A version folder, or the whole artifacts folder (what scripts/train_defaults.sh runs at each start).
    assert main(["convert-histories", str(folder if name == "sasrec-tiny" else root)]) == 0
    converted = latest_versions(root)[name]
    assert convert_root(root) == []  # the newest version needs nothing more
    assert converted.name == f"{folder.name}-2" and (folder / "histories.json").is_file()  # the old one stays
    assert _answers(_open(converted), users) == expected
    assert main(["convert-histories", str(converted)]) == 2  # nothing to convert
    assert main(["convert-histories", str(tmp_path / "no-such-folder")]) == 2


@pytest.mark.parametrize("name", ["sasrec-tiny", "bert4rec-tiny", "social-tiny"])
def test_a_user_is_answered_as_its_stored_history_given_in_the_query(
    tiny_artifacts: Path, tiny_social_artifact: Path, name: str
) -> None:
    """By user (read from the mapped table) and by the same steps in the request (the query path that
    never touches the table) rank alike, exclusions included."""
    engine = _open(latest_versions(tiny_social_artifact if name == "social-tiny" else tiny_artifacts)[name])
    users = sorted(engine.stored_users())
    social = name == "social-tiny"
    # The social model keeps seen users by default and never ranks the actor: ask both ways alike.
    by_user = engine.answer([RecQuery(u, k=7, exclude_seen=True) for u in users])
    given = engine.answer(
        [
            RecQuery(None, list(engine.stored_timeline(u)), k=7, exclude_seen=True, exclude_items=[u] if social else [])
            for u in users
        ]
    )
    assert len(users) > 10
    for u, a, b in zip(users, by_user, given, strict=True):
        assert a.items == b.items, u
        assert (a.excluded["seen"], a.excluded["future"]) == (b.excluded["seen"], b.excluded["future"]), u


@pytest.mark.parametrize(
    ("step", "problem"),
    [(["12", "Infinity"], "a time is infinite"), (["i\ud800", 1.0], "not valid Unicode")],
)
def test_the_converter_refuses_what_the_service_would(
    tiny_artifacts: Path, tmp_path: Path, step: list[object], problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "arts"
    shutil.copytree(tiny_artifacts / "sasrec-tiny", root / "sasrec-tiny")
    folder = latest_versions(root)["sasrec-tiny"]
    _to_old_layout(folder, social=False)
    # Python's json reads and writes both: Infinity as a number, a lone surrogate as an escape.
    text = (folder / "histories.json").read_text()
    first = next(iter(json.loads(text)))
    doc = json.loads(text)
    doc[first] = [*doc[first], json.loads(json.dumps(step).replace('"Infinity"', "Infinity"))]
    (folder / "histories.json").write_text(json.dumps(doc))
    assert main(["convert-histories", str(folder)]) == 2
    assert problem in caplog.text
    assert latest_versions(root)["sasrec-tiny"] == folder  # nothing published
    assert not [p for p in (root / "sasrec-tiny").iterdir() if p.name.startswith(".tmp-")]
