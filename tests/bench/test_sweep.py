"""bench/training/sweep.py: variants x seeds through real training jobs, one Markdown row each, baselines first."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_REC

SWEEP = "bench.training.sweep"


@pytest.mark.slow
def test_two_variants_two_seeds_give_a_table_of_means(
    synthetic_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = Path(__file__).resolve().parents[2] / "training" / "configs" / "sasrec_ml100k.toml"
    argv = [
        SWEEP,
        "--config",
        str(config),
        "--data",
        str(synthetic_dir),
        "--seeds",
        "1",
        "2",
        "--variant",
        "wide:model.d_model=16",
        "--variant",
        "narrow:model.d_model=8;model.d_ff=16",
        "--variant",
        "broken:model.d_model=7",  # not a multiple of the heads: the job fails, the sweep goes on
        "--metric",
        "test.full.NDCG@10",
        "--metric",
        "test.nothing.here",
        "--out",
        str(tmp_path / "sweep"),
        "--set",
        "model.kind='sasrec'",
        "--set",
        "model.n_negatives=8",
        "--set",
        "data.name='syn'",
        *[
            a
            for o in TINY_REC
            if not o.startswith("model.d_")
            for a in ("--set", o.replace("train.epochs=3", "train.epochs=1"))
        ],
    ]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_module(SWEEP, run_name="__main__", alter_sys=True)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| run | n | train s | test.full.NDCG@10 | test.nothing.here |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert set(rows) == {
        "baseline: popularity",
        "baseline: transitions",
        "baseline: item_knn",
        "wide",
        "narrow",
        "broken",
    }
    saved = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [len(saved[v]) for v in ("wide", "narrow")] == [2, 2]
    assert [set(m) for m in saved["broken"]] == [{"failed"}] * 2 and all(m["failed"] for m in saved["broken"])
    assert rows["broken"] == "| broken | 2 | - | - | - |"
    assert "d_model" in (tmp_path / "sweep" / "broken-s1.log").read_text()
    ndcg = [m["test"]["full"]["NDCG@10"] for m in saved["narrow"]]
    mean = sum(ndcg) / 2
    assert "| narrow | 2 | " in rows["narrow"] and f"{mean:.4f} ± " in rows["narrow"]
    assert rows["narrow"].endswith("| - |")  # a path metrics.json lacks is shown as missing, not as 0
