"""Events posted to the service reach the next training run through retrainer.export_history."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from app.store import Event, SQLiteStore
from models.artifact import latest_versions
from models.tasks.recommend import load_artifact as load_rec_artifact
from retrainer.export_history import main as export
from tests.conftest import item_lists, stored, stored_users


def test_exported_log_holds_base_and_events(
    tiny_artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import TINY_REC, run_job
    from training.data import load_interactions

    with TestClient(create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu"))) as c:
        r = c.post(
            "/events",
            json={
                "model": "sasrec-tiny",
                "events": [
                    {"event_id": "n1", "user_id": "u1", "item_id": "brand-new", "timestamp": 1.5e9},
                    {"event_id": "n2", "user_id": "newcomer", "item_id": "12", "timestamp": 1.5e9},
                ],
            },
        )
        assert r.json()["results"][0]["unknown_item"] is True
    out = tmp_path / "log.csv"
    assert export(["--namespace", "sasrec-tiny", "--out", str(out), "--artifacts", str(tiny_artifacts)]) == 0
    base = load_rec_artifact(latest_versions(tiny_artifacts)["sasrec-tiny"])
    data = load_interactions(out)
    assert data.n_interactions == len(base.histories.items) + 2
    folder = run_job(
        ["model.kind='sasrec'", "name='retrained'", "model.n_negatives=8", *TINY_REC, "train.epochs=1"],
        tmp_path / "arts",
        out,
    )
    art = load_rec_artifact(folder)
    assert "brand-new" in art.items.raws() and art.histories.find("newcomer") is not None
    assert export(["--namespace", "nothing-here", "--out", str(tmp_path / "none.csv")]) == 1
    assert "holds no history" in capsys.readouterr().err


HOSTILE = ["a b", "c,d", 'say "hi"', "two\nlines", "tab\there", "cr\r\nlf", "ünï €", "#hash", " lead", "=1+2"]
# Cells a spreadsheet would run, and ids that look like their escaped form: exported inert, read back exact.
FORMULAS = ["=cmd|' /C calc'!A0", "+1", "-2+3", "@SUM(A1)", "'=already", "'plain", "'"]


def test_hostile_ids_round_trip_exactly(tiny_artifacts: Path, tmp_path: Path) -> None:
    from training.data import load_interactions

    events = [
        {"event_id": f"h{n}", "user_id": f"user {u}", "item_id": item, "timestamp": 1.6e9 + n}
        for n, (u, item) in enumerate((u, i) for u in HOSTILE[:3] for i in HOSTILE + FORMULAS)
    ]
    with TestClient(create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu"))) as c:
        r = c.post("/events", json={"model": "sasrec-tiny", "events": events[:20]})
        assert r.status_code == 200 and r.json()["stored"] == 20
        r = c.post("/events", json={"model": "sasrec-tiny", "events": events[20:]})
        assert r.status_code == 200 and r.json()["stored"] == len(events) - 20
    out = tmp_path / "log.csv"
    assert export(["--namespace", "sasrec-tiny", "--out", str(out), "--artifacts", str(tiny_artifacts)]) == 0
    data = load_interactions(out)
    lists = item_lists(data)
    got = {(u, i) for u, items in zip(data.users, lists, strict=True) for i in items if u.startswith("user ")}
    assert got == {(e["user_id"], e["item_id"]) for e in events}
    with out.open(newline="", encoding="utf-8") as f:  # no cell a spreadsheet would run as a formula
        cells = [c for row in csv.reader(f) for c in row]
    assert not [c for c in cells if c.startswith(("=", "+", "-", "@"))]
    assert "'=cmd|' /C calc'!A0" in cells and "''=already" in cells


def test_rows_training_would_refuse_are_skipped_and_counted(
    tiny_artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.data import load_interactions

    state = tmp_path / "state"
    settings = Settings(artifacts_dir=tiny_artifacts, device="cpu", history_path=state / "h.sqlite3")
    with TestClient(create_app(settings)) as c:  # the namespace's trained events settled
        assert c.get("/readyz").status_code == 200
    store = SQLiteStore(state / "h.sqlite3")  # blank ids written before the service refused them
    store.append(
        "sasrec-tiny",
        [Event("x1", "   ", "12", 1.6e9), Event("x2", "u1", " ", 1.6e9), Event("x3", "u1", "13", 1.6e9 + 1)],
    )
    store.close()
    out = tmp_path / "log.csv"
    env = {"SEQSERVE_HISTORY_PATH": str(state / "h.sqlite3")}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        assert export(["--namespace", "sasrec-tiny", "--out", str(out), "--artifacts", str(tiny_artifacts)]) == 0
    err = capsys.readouterr().err
    assert "skipped 1 interaction(s) with a blank item_id" in err and "with a blank user_id" in err
    data = load_interactions(out)  # training takes the log: the blank rows did not block it
    base = load_rec_artifact(latest_versions(tiny_artifacts)["sasrec-tiny"])
    assert data.n_interactions == len(base.histories.items) + 1


def test_a_social_namespace_exports_each_event_once_and_retrains(tiny_social_artifact: Path, tmp_path: Path) -> None:
    from models.tasks.social import load_artifact as load_social_artifact
    from training.data.social import load_social

    with TestClient(create_app(Settings(artifacts_dir=tiny_social_artifact, device="cpu"))) as c:
        r = c.post(
            "/events",
            json={
                "model": "social-tiny",
                "events": [{"event_id": "x1", "user_id": "s3", "item_id": "s9", "action": "c2q", "timestamp": 1.7e9}],
            },
        )
        assert r.status_code == 200 and r.json()["stored"] == 1
    out = tmp_path / "social.csv"
    assert export(["--namespace", "tinysocial", "--out", str(out), "--artifacts", str(tiny_social_artifact)]) == 0
    base = load_social_artifact(latest_versions(tiny_social_artifact)["social-tiny"])
    own = sum(not (a or "").startswith("<-") for u in stored_users(base) for _, _, a in stored(base, u))
    log = load_social(out)  # the export's user_id/item_id columns read as src/dst
    assert len(log) == own + 1 and not any(a.startswith("<-") for a in log.action)
    assert ("s3", "s9", "c2q") in set(zip(log.src, log.dst, log.action, strict=True))


def test_export_reads_a_password_protected_redis_with_the_password_from_a_file(
    tiny_artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As compose's retrain service runs it: Redis with a password, SEQSERVE_REDIS_PASSWORD_FILE."""
    from app.store import Event, RedisStore
    from tests.servers import RedisServer

    srv = RedisServer(tmp_path / "redis", password="s3cret-pw").start()
    try:
        store = RedisStore(srv.url, password="s3cret-pw")
        store.append("sasrec-tiny", [Event("x1", "u1", "from-redis", 1.5e9)])
        store.close()
        (tmp_path / "pw").write_text("s3cret-pw\n")
        monkeypatch.setenv("SEQSERVE_HISTORY_STORE", "redis")
        monkeypatch.setenv("SEQSERVE_REDIS_URL", srv.url)
        monkeypatch.setenv("SEQSERVE_REDIS_PASSWORD_FILE", str(tmp_path / "pw"))
        out = tmp_path / "log.csv"
        assert export(["--namespace", "sasrec-tiny", "--out", str(out), "--artifacts", str(tiny_artifacts)]) == 0
        assert "from-redis" in out.read_text()
    finally:
        srv.kill()
