"""Training jobs on a CUDA device (bf16 autocast by default) learn, and their artifacts serve on the CPU.

Skipped without CUDA (CI has none); run on a GPU machine, see docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_REC, TINY_SOCIAL, run_job

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("precision", ["auto", "fp32"])
@pytest.mark.parametrize("kind", ["sasrec", "bert4rec"])
def test_recommender_trained_on_cuda_beats_popularity(
    kind: str, precision: str, synthetic_dir: Path, tmp_path: Path
) -> None:
    # Long enough for the tiny BERT4Rec too: 150 epochs at lr 5e-3 give 0.60-0.75 on the CPU over 4 seeds.
    folder = run_job(
        [
            f"model.kind='{kind}'",
            f"name='{kind}-cuda'",
            *TINY_REC,
            "train.epochs=150",
            "train.patience=150",
            "train.lr=0.005",
            "train.device='cuda'",
            f"train.precision='{precision}'",
        ],
        tmp_path,
        synthetic_dir,
    )
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["device"].startswith("cuda")
    # The synthetic users walk the catalog in a cycle (popularity: 0.21): a model that learned it is far above.
    assert metrics["test"]["full"]["NDCG@10"] > 1.5 * metrics["baselines_test"]["popularity"]["full"]["NDCG@10"]
    state = torch.load(folder / "model.pt", weights_only=True, map_location="cpu")["state_dict"]
    assert all(t.device.type == "cpu" and t.dtype != torch.bfloat16 for t in state.values())


def test_social_job_on_cuda(social_file: Path, tmp_path: Path) -> None:
    folder = run_job([*TINY_SOCIAL, "train.device='cuda'"], tmp_path, social_file)
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["device"].startswith("cuda")
    assert metrics["test"]["all"]["NDCG@10"] > metrics["baselines_test"]["popularity"]["all"]["NDCG@10"]
