"""Data-parallel training: 2 CPU ranks on two "hosts" under torchrun (gloo) train together and write one artifact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.tasks.recommend import load_artifact as load_rec_artifact
from tests.servers import ROOT
from training.distributed import Dist, resolve_device


def test_shards_are_disjoint_and_equal() -> None:
    batches = list(range(11))
    shards = [Dist(r, 3).shard(batches) for r in range(3)]
    assert [len(s) for s in shards] == [3, 3, 3]  # equal steps, or DDP would wait forever
    flat = [b for s in shards for b in s]
    assert len(set(flat)) == len(flat)
    assert Dist().shard(batches) == batches and Dist().from_main(1.5, 2.0) == [1.5, 2.0]
    with pytest.raises(ValueError, match="batch_size"):
        Dist(0, 4).shard([1, 2, 3])


@pytest.mark.slow
def test_torchrun_on_two_hosts_trains_together_and_writes_one_artifact(tmp_path: Path, synthetic_dir: Path) -> None:
    """Two "hosts" on one box: two torchrun agents (`--nnodes 2`, one rank each) meeting at a c10d
    rendezvous on loopback, each in its own working folder with its own copy of the data and config. They
    train as one job (gloo); only the first host's rank writes the artifact."""
    import shutil

    from bench.servers import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    hosts = []
    for node in (0, 1):
        home = tmp_path / f"host{node}"
        shutil.copytree(synthetic_dir, home / "data")
        (home / "ddp.toml").write_text(
            'name = "sasrec-ddp"\n[model]\nkind = "sasrec"\nmax_len = 16\nd_model = 16\nn_heads = 2\nn_layers = 1\n'
            "d_ff = 32\n[train]\nepochs = 3\nbatch_size = 8\npatience = 5\n[eval]\nn_negatives = 10\n"
        )
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
        cmd += [
            "--node-rank",
            str(node),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            "two-hosts",
        ]
        cmd += ["-m", "training", "train", "--config", str(home / "ddp.toml"), "--data", str(home / "data")]
        cmd += ["--out", str(home / "arts")]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        hosts.append(
            subprocess.Popen(cmd, cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    logs = []
    for proc in hosts:
        out, _ = proc.communicate(timeout=300)
        logs.append(out)
        assert proc.returncode == 0, out[-3000:]
    assert "rank 0 of 2 finished" in logs[0] and "rank 1 of 2 finished" in logs[1]
    assert not (tmp_path / "host1" / "arts").exists()  # the second host's rank wrote nothing
    (folder,) = list((tmp_path / "host0" / "arts" / "sasrec-ddp").iterdir())
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["ranks"] == 2 and metrics["epochs_run"] == 3
    assert len(load_rec_artifact(folder).histories) == 40


@pytest.mark.parametrize(
    ("gpus", "local_world", "rank", "want"),
    [
        (0, 1, 0, "cpu"),
        (1, 1, 0, "cuda:0"),
        (4, 2, 1, "cuda:1"),
        (1, 2, 1, "cpu"),  # more ranks than GPUs on the host: every rank on the CPU, never cuda:1 of 1
    ],
)
def test_auto_device_per_rank(
    gpus: int, local_world: int, rank: int, want: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    assert str(resolve_device("auto", rank)) == want


def test_explicit_cuda_with_too_few_gpus_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="2 ranks on this host but 1 CUDA"):
        resolve_device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
