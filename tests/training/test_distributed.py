"""Data-parallel training: 2 CPU ranks on two "hosts" under torchrun (gloo) train together and write one artifact."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.tasks.recommend import load_artifact as load_rec_artifact
from tests.servers import ROOT
from tests.training.ranks import spawn_ranks
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


class _Payload:
    """What a stranger writes into a rendezvous store: unpickling it creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def _write_payload_into_store(port: int, marker: Path) -> None:
    """A process that is not a node reaches the first host's store and writes a pickle where torchrun's c10d
    rendezvous reads its state (that launch unpickled it in the agent and ran it)."""
    import base64
    import pickle

    from torch.distributed import TCPStore

    from tests.servers import wait_until

    stores: list[TCPStore] = []

    def connected() -> bool:
        try:
            stores.append(TCPStore("127.0.0.1", port, is_master=False, timeout=dt.timedelta(seconds=5)))
        except (RuntimeError, OSError):
            return False
        return True

    wait_until(connected, timeout=60)
    state = base64.b64encode(pickle.dumps(_Payload(marker))).decode()
    for run_id in ("none", "two-hosts"):
        stores[0].set(f"torch.rendezvous.{run_id}", state)
        stores[0].set(f"{run_id}/torch.rendezvous.{run_id}", state)


@pytest.mark.slow
def test_torchrun_on_two_hosts_each_reading_its_share_writes_one_artifact(tmp_path: Path) -> None:
    """Two "hosts" on one box, launched as the README says (`python -m training.launch`: two torchrun agents,
    one rank each, a static rendezvous on loopback), each in its own working folder with its own copy of a
    Parquet log (two parts) and the config. A stranger who reaches the first host's store while it waits
    writes a pickle into it: nothing runs it. Each rank reads only its users (`data.share_by_user`); they
    agree on one item map, train and validate as one job (gloo), and only the first host's rank writes the
    artifact, with every user in it."""
    import re

    import pandas as pd

    from bench.servers import free_port
    from tests.conftest import synthetic_log

    log = pd.DataFrame(synthetic_log(), columns=["user_id", "item_id", "timestamp"])
    port = free_port()
    marker = tmp_path / "stranger-ran-code"
    hosts = []
    for node in (0, 1):
        home = tmp_path / f"host{node}"
        (home / "data").mkdir(parents=True)
        log.iloc[:200].to_parquet(home / "data" / "part-00000.parquet", index=False)
        log.iloc[200:].to_parquet(home / "data" / "part-00001.parquet", index=False)
        (home / "ddp.toml").write_text(
            'name = "sasrec-ddp"\n[model]\nkind = "sasrec"\nmax_len = 16\nd_model = 16\nn_heads = 2\nn_layers = 1\n'
            "d_ff = 32\ntransition_width = 4\n[data]\nshare_by_user = true\n"
            "[train]\nepochs = 3\nbatch_size = 4\npatience = 5\nrefit_epochs = 1\n[eval]\nn_negatives = 10\n"
        )
        cmd = [sys.executable, "-m", "training.launch", "--nodes", "2", "--node-rank", str(node)]
        cmd += ["--master", f"127.0.0.1:{port}", "--iface", "lo", "--"]
        cmd += ["train", "--config", str(home / "ddp.toml"), "--data", str(home / "data")]
        cmd += ["--out", str(home / "arts")]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        hosts.append(
            subprocess.Popen(cmd, cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
        if node == 0:  # the first host waits for the second: the stranger comes now
            _write_payload_into_store(port, marker)
    logs = []
    try:
        for proc in hosts:
            out, _ = proc.communicate(timeout=300)
            logs.append(out)
    finally:  # a host that failed leaves the other waiting for it: both go, with what each said
        for proc in hosts:
            proc.kill()
        for proc in hosts[len(logs) :]:
            logs.append(proc.communicate()[0])
    for proc in hosts:
        assert proc.returncode == 0, "\n---\n".join(o[-3000:] for o in logs)
    assert "rank 0 of 2 finished, peak RSS" in logs[0] and "rank 1 of 2 finished, peak RSS" in logs[1]
    assert not marker.exists()  # the stranger's pickle was never loaded
    held = [re.search(r"holds (\d+) users; item map of (\d+) items, sha256 (\w+)", out) for out in logs]
    users = [int(m.group(1)) for m in held if m]
    assert len(users) == 2 and sum(users) == 40 and min(users) > 0  # disjoint shares of the 40 users
    assert [int(m.group(2)) for m in held if m] == [30, 30]  # every item, on both ranks
    assert len({m.group(3) for m in held if m}) == 1  # the same map: an item is one index everywhere
    assert not (tmp_path / "host1" / "arts").exists()  # the second host's rank wrote nothing
    (folder,) = list((tmp_path / "host0" / "arts" / "sasrec-ddp").iterdir())
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["ranks"] == 2 and metrics["epochs_run"] == 3
    assert metrics["protocol"]["users_split_over_ranks"] == 2
    assert metrics["protocol"]["test_users"]["scored"] == metrics["protocol"]["test_users"]["of"] == 40
    # Validation too: each rank scored its own users, pooled on rank 0 (each epoch's, the baselines', the
    # prior weight's).
    assert metrics["protocol"]["valid_users"]["scored"] == metrics["protocol"]["valid_users"]["of"] == 40
    assert metrics["protocol"]["baselines_valid_users"] == 40
    assert all(v["n"] == 40 for v in metrics["history"]["val"])
    artifact = load_rec_artifact(folder)
    assert sorted(artifact.histories.users()) == sorted(f"u{k}" for k in range(40))  # both ranks' users
    assert artifact.manifest.data["interactions"] == len(log)


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


def test_pooled_figures_weigh_each_rank_by_the_users_it_scored() -> None:
    """Rank 0 turns every rank's means into the means over all their users; a rank without users adds none."""
    from training.jobs.recommend_eval import Evaluated, pooled

    def ours(ndcg: float, users: int) -> Evaluated:
        figures = {"HR@10": min(2 * ndcg, 1.0), "NDCG@10": ndcg, "n": float(users)} if users else {"n": 0.0}
        return Evaluated({"model": {"full": figures}}, users, users + 1, 0.5 + users / 100)

    ranks = [ours(0.5, 30), ours(0.1, 10), ours(0.0, 0)]

    class Gathered(Dist):
        """gather() as torch.distributed's: the others' tensors reach rank 0 only."""

        def gather(self, t: torch.Tensor, *, everywhere: bool = False, to: int = 0) -> list[torch.Tensor]:
            if self.rank:
                sent.append(t)
                return []
            return [t, *sent]

    sent: list[torch.Tensor] = []
    for r in (1, 2):
        assert pooled(ranks[r], Gathered(r, 3, own_data=True)) is ranks[r]  # its figures went to rank 0
    got = pooled(ranks[0], Gathered(0, 3, own_data=True))
    figures = got.metrics["model"]["full"]
    assert (got.users, got.of, got.seconds) == (40, 43, 0.8)
    assert figures["NDCG@10"] == pytest.approx((0.5 * 30 + 0.1 * 10) / 40) and figures["n"] == 40
    assert figures["HR@10"] == pytest.approx((1.0 * 30 + 0.2 * 10) / 40) and figures["MRR"] == 0.0
    assert pooled(ranks[1], Gathered(1, 3)) is ranks[1]  # ranks holding everyone's data: nothing to pool


def test_ranks_evaluating_their_own_users_take_a_share_and_rank_0_s_decisions() -> None:
    class FromMain(Dist):
        def from_main(self, *values: float) -> list[float]:
            return [7.0, 100.0][: len(values)]  # what rank 0 sent

    mine, copy = FromMain(1, 4, own_data=True), FromMain(1, 4)
    assert (mine.share_of(10), copy.share_of(10), mine.share_of(0)) == (3, 10, 0)
    assert (mine.agreed(1.0, 2.0), copy.agreed(1.0, 2.0)) == ([7.0, 100.0], [1.0, 2.0])
    import time

    deadline = mine.main_deadline(time.monotonic() + 1_000.0)  # rank 0 has 7 s left: so does this rank
    assert deadline is not None and 6.0 < deadline - time.monotonic() <= 7.0
    assert Dist().main_deadline(None) is None and Dist().counted(2, 3) == [2, 3]


def test_a_rank_holding_its_own_data_alone_gives_the_plain_job_s_figures(synthetic_dir: Path, tmp_path: Path) -> None:
    """The own-data path (summed counts, merged pair counts, pooled test, gathered histories) with one
    rank is the job as one process runs it: the same test figures, prior weight and artifact histories."""
    from tests.conftest import TINY_REC
    from training.config import read_raw
    from training.jobs import job_for_kind

    raw = read_raw(
        None,
        [
            "model.kind='sasrec'",
            "name='own'",
            "model.n_negatives=8",
            "model.transition_width=4",
            "train.refit_epochs=1",
            *TINY_REC,
        ],
    )
    job = job_for_kind("sasrec")
    runs = {}
    for name, dist in (("plain", Dist()), ("own", Dist(own_data=True))):
        folder = job(job.parse_config(raw), out_root=tmp_path / name, data_path=synthetic_dir, dist=dist).run()
        assert folder is not None
        runs[name] = (json.loads((folder / "metrics.json").read_text()), load_rec_artifact(folder))
    (plain, plain_art), (own, own_art) = runs["plain"], runs["own"]
    assert own["test"] == plain["test"] and own["test_network_alone"] == plain["test_network_alone"]
    assert own["transition_prior_valid_ndcg10"] == plain["transition_prior_valid_ndcg10"]
    assert own["protocol"]["test_users"] == plain["protocol"]["test_users"]
    assert own["protocol"]["users_split_over_ranks"] == 1 and "users_split_over_ranks" not in plain["protocol"]
    assert list(own_art.histories.users()) == list(plain_art.histories.users())
    assert torch.equal(own_art.model.successors, plain_art.model.successors)


def test_strings_from_ranks_arrive_whole_and_a_rank_with_none_sends_an_empty_list() -> None:
    """gather_strings cuts the bytes each rank sent at its lengths: ids with any characters, and none."""

    class BesideAnEmptyRank(Dist):
        def gather(self, t: torch.Tensor, *, everywhere: bool = False, to: int = 0) -> list[torch.Tensor]:
            return [t, t[:0]]  # this rank's tensor, then an empty rank's

    got = BesideAnEmptyRank(0, 2).gather_strings(["u1", "ü, 2", "", "x\ny"], everywhere=True)
    assert got == [["u1", "ü, 2", "", "x\ny"], []]
    assert Dist().gather_strings(["a"]) == [["a"]]


_V = 40
_PROBE = torch.tensor([[5, 6, 7], [9, 0, 0], [3, 3, 12]])


def _users() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 25, (120,), generator=gen).tolist()
    return [torch.randint(2, _V, (n,), generator=gen).tolist() for n in lengths]


def _fit_on_a_share(rank: int, world: int, port: int, out: Path, seconds: float) -> None:
    """One rank of `world`: fits every baseline on its users (every world-th), as the job does."""
    import torch.distributed as tdist

    from training.jobs import recommend_eval as ev

    ev.KNN_BLOCK_PAIRS = 40  # many blocks: owned by the ranks in turn
    ev.PAIR_RANGE = 50  # the pair counts summed in many ranges of keys
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        dist = Dist(rank, world, own_data=True)
        mine = _users()[rank::world]
        got = {}
        for name in ev.BASELINES:
            scorer, n = ev.fit_baseline(name, mine, _V, dist=dist)
            got[name], got[f"{name}_users"] = scorer(_PROBE), torch.tensor(n)
        scorer, n = ev.fit_baseline("item_knn", mine, _V, seconds=seconds, seed=3, dist=dist)
        got["sampled"], got["sampled_users"] = scorer(_PROBE), torch.tensor(n)
        # A rank without a user (a sample that missed all of its users) fits with the others all the same.
        scorer, n = ev.fit_baseline("item_knn", mine if rank == 0 else [], _V, dist=dist)
        got["rank0"], got["rank0_users"] = scorer(_PROBE), torch.tensor(n)
        torch.save(got, out / f"rank{rank}.pt")
    finally:
        tdist.destroy_process_group()


def test_ranks_holding_their_own_users_fit_the_baselines_one_process_fits_on_all(tmp_path: Path) -> None:
    """Two gloo ranks, each with half the users, fit each baseline together: every rank gets the
    scores one process fitting all the users gets (item-kNN's blocks summed on their owners in turn,
    the transitions' pair counts by ranges of keys);
    a sampled fit is one sample of all the users, the same on both ranks; a rank holding no user
    fits with the other."""
    import numpy as np

    from bench.servers import free_port
    from training.jobs.recommend_eval import BASELINES, FIT_SECONDS, fit_baseline

    users = _users()
    half = float(FIT_SECONDS["item_knn"](np.array([len(u) for u in users])).sum()) / 2
    spawn_ranks(_fit_on_a_share, (2, free_port(), tmp_path, half), ranks=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for name in BASELINES:
        alone, n = fit_baseline(name, users, _V)
        for got in ranks:
            assert torch.equal(got[name], alone(_PROBE)), name
            assert int(got[f"{name}_users"]) == n == len(users)
    sampled = [int(got["sampled_users"]) for got in ranks]
    assert sampled[0] == sampled[1] and 0 < sampled[0] < len(users)
    assert torch.equal(ranks[0]["sampled"], ranks[1]["sampled"])
    assert not torch.equal(ranks[0]["sampled"], ranks[0]["item_knn"])
    alone, n = fit_baseline("item_knn", users[0::2], _V)
    for got in ranks:
        assert torch.equal(got["rank0"], alone(_PROBE)) and int(got["rank0_users"]) == n == len(users[0::2])
