"""Loaders and the default job on the real files beside the project; skipped with a reason where they are absent."""

import json
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, SHARED_DATA, run_job, time_lists
from training.data import load_interactions

ML100K = SHARED_DATA / "ml-100k"
BEAUTY = SHARED_DATA / "amazon-beauty" / "beauty.txt"


@pytest.mark.skipif(not (ML100K / "ml-100k.inter").exists(), reason=f"real data absent: {ML100K}")
def test_ml100k_counts_and_release_years() -> None:
    data = load_interactions(ML100K)
    assert len(data.users) == 943 and data.n_interactions == 100_000 and len(data.item_ids) == 1682
    assert data.release_unit == "year"
    # 1,682 movies; one has no year at all, and one stores "V" where the year belongs (taken from its title).
    assert len(data.release) == 1681 and data.release["1412"] == 1995.0
    assert all(t == sorted(t) for t in time_lists(data))


@pytest.mark.skipif(not BEAUTY.exists(), reason=f"real data absent: {BEAUTY}")
def test_beauty_counts() -> None:
    data = load_interactions(BEAUTY)
    assert len(data.users) == 40_226 and data.n_interactions == 353_962 and len(data.item_ids) == 54_542


@pytest.mark.skipif(not (ML100K / "ml-100k.inter").exists(), reason=f"real data absent: {ML100K}")
def test_the_default_movielens_model_is_validated_and_tested_on_every_user(tmp_path: Path) -> None:
    """The whole evaluation of MovieLens-100k costs about a second: the main command's model covers all 943
    users in validation and test, even when the loop takes its whole budget (the deadlines are for big logs)."""
    folder = run_job(["train.max_minutes=0.1"], tmp_path, ML100K / "ml-100k.inter", CONFIGS / "sasrec_ml100k.toml")
    protocol = json.loads((folder / "metrics.json").read_text())["protocol"]
    assert protocol["valid_users"] == {"scored": 943, "of": 943}
    assert (protocol["test_users"]["scored"], protocol["test_users"]["of"]) == (943, 943)
