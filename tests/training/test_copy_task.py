import json
from pathlib import Path

import pytest
import torch

from tests.conftest import CONFIGS, run_job

# A few hundred steps of a small model on short sequences: enough to copy if attention, masks,
# positions and decoding are right, and nowhere near it if any of them is broken.
TINY_COPY = [
    "data.vocab_size=10",
    "data.min_len=3",
    "data.max_len=6",
    "data.num_samples=4000",
    "data.val_samples=200",
    "data.test_min_len=7",
    "data.test_max_len=8",
    "data.test_samples=50",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=2",
    "model.d_ff=64",
    "train.epochs=5",
    "train.batch_size=32",
    "train.warmup_steps=50",
    "train.lr=2e-3",
    "train.max_minutes=10",  # the epochs decide, not the clock: a busy machine still trains all five
    "eval.predictions=5",
]


@pytest.mark.slow
def test_tiny_copy_task_learns_to_copy_and_writes_its_run(tmp_path: Path) -> None:
    folder = run_job(TINY_COPY, tmp_path, config=CONFIGS / "copy_task.toml")
    names = {p.name for p in folder.iterdir()}
    assert {"model.pt", "metrics.json", "run_config.json", "predictions.json", "curves.png"} <= names
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["valid"]["token_acc"] >= 0.9, metrics["valid"]
    epochs = metrics["epochs"]
    assert (
        len(epochs) == metrics["epochs_run"]
        and {"train_loss", "val_loss", "val_token_acc", "val_seq_acc"} <= epochs[0].keys()
    )
    run = json.loads((folder / "run_config.json").read_text())
    best = run["best_checkpoint"]
    assert best["epoch"] == metrics["best_epoch"] and best["val_loss"] == min(e["val_loss"] for e in epochs)
    assert run["model"]["d_model"] == 32
    ckpt = torch.load(folder / best["path"], weights_only=True)
    assert "state_dict" in ckpt
    preds = json.loads((folder / "predictions.json").read_text())
    assert len(preds) == 5 and all(p["source"] == p["target"] for p in preds)
    assert sum(p["match"] for p in preds) == sum(p["output"] == p["target"] for p in preds)
