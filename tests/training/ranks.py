"""Gloo ranks started in this test process's children (`torch.multiprocessing.spawn`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def spawn_ranks(fn: Callable[..., None], args: tuple[Any, ...], *, ranks: int, seconds: float = 120.0) -> None:
    """`fn(rank, *args)` on `ranks` processes; fails the test when one fails, or when they are still
    running after `seconds` (a collective that one rank never joins waits for ever)."""
    import torch.multiprocessing as mp

    ctx = mp.spawn(fn, args=args, nprocs=ranks, join=False)
    deadline = time.monotonic() + seconds
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the ranks were still running after {seconds:g} s: a collective left waiting")
