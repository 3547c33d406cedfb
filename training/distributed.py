"""Data-parallel training under torchrun: NCCL between GPUs, gloo on the CPU.

`torchrun --nproc-per-node N -m training train --config ...` starts N ranks. Each rank draws the same
shuffled batches (same seed) and trains on its own share of them; DistributedDataParallel averages
the gradients, so every rank holds the same weights. Rank 0 validates and broadcasts what it found,
so all ranks stop together; only rank 0 evaluates the test split and writes the artifact.
Where each rank reads only its users' share of the log (`own_data`), each trains on its own batches
(as many steps as the rank with the fewest), sums its counts with the others', scores its own
validation and test users and sends its users' histories to rank 0's artifact in rounds
(docs/decisions/rank-shares.md).
Without torchrun (no WORLD_SIZE) everything here is a no-op.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as tdist
from torch import nn

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0  # this rank's GPU on its host
    own_data: bool = False  # each rank holds its own users' data, not a copy of everyone's

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, batches: Sequence[T]) -> Sequence[T]:
        """This rank's batches: every rank gets the same count (DDP needs equal steps), so up to
        world - 1 batches of an epoch are left out; they differ from epoch to epoch."""
        if not self.enabled:
            return batches  # as drawn: a lazy epoch stays lazy
        if self.own_data:  # each rank's own batches, cut to the fewest any rank has
            fewest = self.fewest(len(batches))
            if fewest == 0:
                raise ValueError("a rank has no training batch: fewer users than ranks, or lower batch_size")
            return list(batches[:fewest])
        per_rank = len(batches) // self.world
        if per_rank == 0:
            raise ValueError(f"{len(batches)} batches cannot be shared by {self.world} ranks: lower batch_size")
        return list(batches[self.rank :: self.world][:per_rank])

    def from_main(self, *values: float) -> list[float]:
        """Rank 0's values on every rank (decisions such as early stopping must agree)."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._device())
        tdist.broadcast(t, src=0)
        return [float(v) for v in t.tolist()]

    def all_reduce(self, t: torch.Tensor, op: Any = None) -> torch.Tensor:
        """`t` reduced over the ranks (a sum unless `op`), on `t`'s device; `t` itself alone."""
        if not self.enabled:
            return t
        out = t.to(self._device())
        tdist.all_reduce(out, op=tdist.ReduceOp.SUM if op is None else op)
        return out.to(t.device)

    def fewest(self, n: int) -> int:
        """The smallest of every rank's `n` (`n` itself alone)."""
        if not self.enabled:
            return n
        return int(self.all_reduce(torch.tensor([n], dtype=torch.int64), op=tdist.ReduceOp.MIN).item())

    def total(self, t: torch.Tensor) -> torch.Tensor:
        """Counts over the whole log: summed over the ranks when each holds its own users, else `t`."""
        return self.all_reduce(t) if self.own_data else t

    def counted(self, *counts: int) -> list[int]:
        """Counts of users (or rows) over the whole log (summed over the ranks that each hold their own)."""
        return [int(n) for n in self.total(torch.tensor(counts, dtype=torch.int64)).tolist()]

    # Where each rank holds its own users, the ranks evaluate together: each scores its share, rank 0
    # pools the figures, and every decision taken on them must be rank 0's everywhere.
    def share_of(self, n: int) -> int:
        """A rank's part of `n` users to score (0 = all) where each rank scores its own, else `n`."""
        return math.ceil(n / self.world) if self.own_data else n

    def agreed(self, *values: float) -> list[float]:
        """Rank 0's values on every rank where the ranks evaluate together, else the values themselves."""
        return self.from_main(*values) if self.own_data else list(values)

    def main_deadline(self, deadline: float | None) -> float | None:
        """Rank 0's deadline (its time left) on every rank that evaluates with it: rank 0 priced the
        scorers before training, and a rank that did not must not plan its phase as free."""
        (left,) = self.agreed(math.inf if deadline is None else deadline - time.monotonic())
        return None if math.isinf(left) else time.monotonic() + left

    def gather(self, t: torch.Tensor, *, everywhere: bool = False, to: int = 0) -> list[torch.Tensor]:
        """Every rank's 1-D `t` (lengths may differ), in rank order: on rank `to` only (others get [])
        unless `everywhere`. Tensors, not pickled objects: nothing a peer sends is unpickled."""
        if not self.enabled:
            return [t]
        device = self._device()
        sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.world)]
        tdist.all_gather(sizes, torch.tensor([len(t)], dtype=torch.int64, device=device))
        lengths = [int(n.item()) for n in sizes]
        padded = torch.zeros(max(*lengths, 1), dtype=t.dtype, device=device)
        padded[: len(t)] = t.to(device)
        if everywhere:
            parts = [torch.empty_like(padded) for _ in range(self.world)]
            tdist.all_gather(parts, padded)
        else:
            parts = [torch.empty_like(padded) for _ in range(self.world)] if self.rank == to else []
            tdist.gather(padded, parts if self.rank == to else None, dst=to)
        return [part[:n].to(t.device) for part, n in zip(parts, lengths, strict=False)]

    def gather_strings(self, values: Sequence[str], *, everywhere: bool = False) -> list[list[str]]:
        """Every rank's strings, in rank order (see `gather`): UTF-8 bytes and their lengths."""
        if not self.enabled:
            return [list(values)]
        encoded = [v.encode() for v in values]
        blob = torch.from_numpy(np.frombuffer(b"".join(encoded), dtype=np.uint8).copy())
        lengths = self.gather(torch.tensor([len(b) for b in encoded], dtype=torch.int64), everywhere=everywhere)
        data = self.gather(blob, everywhere=everywhere)
        out = []
        for n, raw in zip(lengths, data, strict=True):
            text, ends = raw.numpy().tobytes(), n.cumsum(0).tolist()
            out.append([text[a:b].decode() for a, b in itertools.pairwise([0, *ends])])
        return out

    def _device(self) -> torch.device:
        nccl = tdist.get_backend() == "nccl"
        return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    def wrap(self, model: nn.Module) -> nn.Module:
        """A module whose forward is the model's training loss, under DDP when distributed."""
        step = _LossStep(model)
        if not self.enabled:
            return step
        device = next(model.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        # Parameters some batches leave unused (e.g. a copy head) must not stall the gradient sync.
        return nn.parallel.DistributedDataParallel(step, device_ids=ids, find_unused_parameters=True)

    def finish(self) -> None:
        """Wait until every rank is done before any tears down: a rank that left while another still
        worked (rank 0 exports alone) sometimes aborted in gloo's teardown ("terminate called without
        an active exception"). Only on success: a rank that failed must not wait for the others."""
        if self.enabled and tdist.is_initialized():
            tdist.barrier()

    def close(self) -> None:
        if self.enabled and tdist.is_initialized():
            tdist.destroy_process_group()


ONE_PROCESS = Dist()  # no torchrun: this process holds the whole log


class _LossStep(nn.Module):
    """DDP synchronises gradients through forward(); the models expose their loss as loss()."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Any) -> torch.Tensor:
        return self.model.loss(batch)  # type: ignore[operator]


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """This rank's device. auto = its own CUDA device when the host has one per local rank, else the CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if name == "auto":
        # Every rank of a host sees the same counts, so all agree on GPUs (NCCL) or the CPU (gloo).
        name = f"cuda:{local_rank}" if 0 < local_world <= gpus else "cpu"
    dev = torch.device(name)
    if dev.type != "cuda":
        return dev
    if gpus == 0:
        raise ValueError(f"train.device={name!r} but CUDA is not available")
    if local_world > gpus:
        raise ValueError(
            f"{local_world} ranks on this host but {gpus} CUDA device(s): start at most {gpus} "
            "per host (torchrun --nproc-per-node) or set train.device='cpu'"
        )
    return torch.device("cuda", local_rank) if local_world > 1 else dev


def setup(device: str = "auto") -> Dist:
    """Join the process group torchrun describes in the environment; a single process otherwise.

    NCCL when the ranks train on GPUs (each on its LOCAL_RANK device), gloo on the CPU.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    # A long timeout: the other ranks wait while rank 0 validates an epoch.
    tdist.init_process_group(backend, timeout=dt.timedelta(hours=2))
    log.info("distributed training: rank %d of %d (%s)", rank, world, backend)
    return Dist(rank, world, local_rank)
