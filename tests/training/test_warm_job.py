"""A warm retrain: a served version continues on its log plus live events; new items join the catalog."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from models.artifact import latest_versions
from models.ids import IdMap
from models.warm import first_seen_live
from tests.conftest import synthetic_log
from training.__main__ import main


def test_warm_retrain_extends_the_catalog_and_keeps_item_meta(tiny_artifacts: Path, tmp_path: Path) -> None:
    base = latest_versions(tiny_artifacts)["sasrec-tiny"]
    log = tmp_path / "log.csv"
    with log.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["user_id", "item_id", "timestamp"])
        w.writerows(synthetic_log())
        w.writerows([("u1", "fresh-item", 2_000_000_000), ("u2", "fresh-item", 2_000_000_001)])  # first seen live
    out = tmp_path / "arts"
    assert main(["warm", "--artifact", str(base), "--data", str(log), "--minutes", "0.05", "--out", str(out)]) == 0
    new = latest_versions(out)["sasrec-tiny"]
    assert "fresh-item" in IdMap.load(new / "items.json")
    run = json.loads((new / "run_config.json").read_text())
    assert run["warm_start"]["items_new"] == 1 and run["warm_start"]["from"] == f"sasrec-tiny/{base.name}"
    assert run["warm_start"]["items_kept"] == IdMap.load(base / "items.json").n_entities
    # What serving reads to tell lists holding an item first seen live from the others.
    assert first_seen_live(json.loads((new / "manifest.json").read_text())["config"]) == ["fresh-item"]
    meta = json.loads((new / "item_meta.json").read_text())  # release years carried from the served version
    assert meta["unit"] == "year" and "fresh-item" not in meta["release"] and len(meta["release"]) > 10


def test_warm_retrain_refuses_another_kind(tiny_artifacts: Path, tmp_path: Path) -> None:
    bert = latest_versions(tiny_artifacts)["bert4rec-tiny"]
    log = tmp_path / "log.csv"
    log.write_text("user_id,item_id,timestamp\nu1,10,1\nu1,11,2\nu1,12,3\n")
    code = main(["warm", "--artifact", str(bert), "--data", str(log), "--set", "model.kind='sasrec'"])
    assert code == 2


@pytest.mark.parametrize("missing", ["nothing-here"])
def test_warm_retrain_needs_a_version(tmp_path: Path, missing: str) -> None:
    assert main(["warm", "--artifact", str(tmp_path / missing), "--data", str(tmp_path / "x.csv")]) == 2


def test_a_warm_retrain_under_its_parents_bound_is_held_back(tiny_artifacts: Path, tmp_path: Path) -> None:
    from models.artifact import HELD, read_manifest, versions

    base = latest_versions(tiny_artifacts)["sasrec-tiny"]
    parent = read_manifest(base).metrics["full_ndcg10_vs_best_baseline"]["ratio"]
    log = tmp_path / "log.csv"
    with log.open("w", newline="") as f:
        csv.writer(f).writerows([("user_id", "item_id", "timestamp"), *synthetic_log()])
    out = tmp_path / "arts"
    # A bound no retrain reaches (100x its parent's figure): written aside, exit 3, nothing published.
    args = ["warm", "--artifact", str(base), "--data", str(log), "--minutes", "0.05", "--out", str(out)]
    assert main([*args, "--gate", "100"]) == 3
    assert "sasrec-tiny" not in latest_versions(out)
    (held,) = versions(out / HELD / "sasrec-tiny")
    reason = read_manifest(held).metrics["held_back"]
    assert f"{parent:.2f}x of the version it started from ({base.name})" in reason
    assert main([*args, "--gate", "0"]) == 0 and "sasrec-tiny" in latest_versions(out)  # 0: never held


def test_a_social_model_retrains_warm_with_users_first_seen_live(
    tiny_social_artifact: Path, social_file: Path, tmp_path: Path
) -> None:
    """The exported log (the base's rows, then live ones, in the service's column names) continues the
    served version: its users and actions carried, a user first seen live joins the candidates."""
    base = latest_versions(tiny_social_artifact)["social-tiny"]
    log = tmp_path / "log.csv"
    with social_file.open() as src, log.open("w", newline="") as f:
        rows = list(csv.reader(src))[1:]
        w = csv.writer(f)
        w.writerow(["user_id", "item_id", "timestamp", "action"])
        w.writerows([s, d, t, a] for s, d, a, t in rows)
        # Early enough for the job's user map (users seen before its test period: the newest 10%).
        middle = sorted(int(r[3]) for r in rows)[len(rows) // 2]
        w.writerows([["s1", "newcomer", middle + 1, "a2q"], ["newcomer", "s1", middle + 2, "c2a"]])
    out = tmp_path / "arts"
    assert main(["warm", "--artifact", str(base), "--data", str(log), "--minutes", "0.05", "--out", str(out)]) == 0
    new = latest_versions(out)["social-tiny"]
    run = json.loads((new / "run_config.json").read_text())
    warm = run["warm_start"]
    assert warm["from"] == f"social-tiny/{base.name}" and warm["fresh_tensors"] == []
    assert warm["users_kept"] == IdMap.load(base / "users.json").n_entities and warm["users_new"] == 1
    assert first_seen_live(json.loads((new / "manifest.json").read_text())["config"]) == ["newcomer"]


def test_a_social_warm_start_leaves_the_activity_weights_fresh_when_the_actions_change(
    tiny_social_artifact: Path, social_file: Path, tmp_path: Path
) -> None:
    """The activity input's weights are laid out by the log's own actions: as many actions, but another
    one in place of c2a, and copying them whole would give its counts c2a's weight."""
    base = latest_versions(tiny_social_artifact)["social-tiny"]
    log = tmp_path / "log.csv"
    log.write_text(social_file.read_text().replace(",c2a,", ",q2c,"))
    out = tmp_path / "arts"
    assert main(["warm", "--artifact", str(base), "--data", str(log), "--minutes", "0.05", "--out", str(out)]) == 0
    warm = json.loads((latest_versions(out)["social-tiny"] / "run_config.json").read_text())["warm_start"]
    assert "activity_weight" in warm["fresh_tensors"] and "user_emb.weight" not in warm["fresh_tensors"]
