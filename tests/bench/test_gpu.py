"""bench/scale/gpu.py, the GPU run's script, in its tiny mode: every step on the CPU, ready the day a GPU is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from models.artifact import latest_versions
from tests.conftest import TINY_REC
from tests.servers import ROOT, free_port


@pytest.mark.slow
def test_every_step_of_the_gpu_run_reports_its_figures_on_the_cpu(
    tiny_artifacts: Path, synthetic_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "gpu.json"
    args = ["--tiny", "--devices", "cpu", "--steps", "tests", "model", "profile", "serve", "train"]
    args += ["--artifact", str(latest_versions(tiny_artifacts)["sasrec-tiny"]), "--data", str(synthetic_dir)]
    args += ["--train-minutes", "0.1", "--train-set", *TINY_REC, "train.epochs=2", "--port", str(free_port())]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.scale.gpu", *args, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    for step in ("environment", "catalogs", "tests", "model", "profile", "serve", "train"):
        assert "error" not in got[step], got[step]
    assert got["tests"]["returncode"] == 0 and "skipped" in got["tests"]["summary"]  # no CUDA here
    sizes = list(got["catalogs"])
    assert sizes[1] == "3000"  # the synthetic catalog of the tiny mode
    for size in sizes:
        assert got["model"][f"{size}/cpu"]["batch_1_ms"] > 0 and got["model"][f"{size}/cpu"]["batch_16_ms"] > 0
        assert got["profile"][size]["host_us_per_call"] > 0 and got["profile"][size]["top_host_us"]
        served = got["serve"][f"{size}/cpu/c4"]
        assert served["rps"] > 0 and served["errors"] == 0
    train = got["train"]
    assert train["device"] == "cpu" and train["epochs_run"] >= 1 and train["valid_ndcg10"] is not None
    # One rate per epoch, then one per refit epoch.
    assert train["windows_per_s_median"] > 0 and len(train["windows_per_s_each_epoch"]) >= train["epochs_run"]
    assert set(got["targets"]) == {"one_query_ms", "batch_256_at_1m_ms", "serve_gpu_over_cpu", "train_windows_over_cpu"}
