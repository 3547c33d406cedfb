"""Training steps keep large freed blocks in the heap instead of a fresh mmap per allocation, and give
them back when the steps end."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# In a child process, so the allocator settings do not leak into the rest of the suite. Prints the
# bytes in mmapped blocks while a 100 MB block is held, then the heap's size after it is freed.
CHILD = """
import ctypes, ctypes.util, sys
from training.memory import reuse_freed_memory, steps_keep_freed_memory

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def held_then_kept():
    block = libc.malloc(100 << 20)
    held = libc.mallinfo2().hblkhd
    libc.free(block)
    return held, libc.mallinfo2().arena

if sys.argv[1] == "on":
    assert reuse_freed_memory()
if sys.argv[1] == "steps":  # the same inside the steps, then again after them
    with steps_keep_freed_memory():
        print(*held_then_kept())
print(*held_then_kept())
"""

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc malloc's")


def _child(mode: str) -> list[tuple[int, int]]:
    """Per block malloc'd and freed: the bytes in mmapped blocks while it was held, the heap's size after."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [(int(line.split()[0]), int(line.split()[1])) for line in out.splitlines()]


def test_a_large_block_comes_from_the_heap_and_stays_there_after_free() -> None:
    ((mmapped, heap),) = _child("on")
    assert mmapped < 100 << 20  # not its own mapping
    assert heap >= 100 << 20  # freed, but kept for the next step's tensors


def test_without_the_setting_a_large_block_is_its_own_mapping() -> None:
    # The control: glibc's default, which the first test must differ from.
    ((mmapped, heap),) = _child("off")
    assert mmapped >= 100 << 20
    assert heap < 100 << 20


def test_steps_keep_freed_memory_then_give_it_back_when_they_end() -> None:
    """The phases around training (loading, the baselines' fits, the evaluation) must not stack their
    one-off peaks on the heap the steps kept: after the steps, large blocks are mapped again and the
    kept memory is returned."""
    (inside_mmapped, inside_heap), (after_mmapped, after_heap) = _child("steps")
    assert inside_mmapped < 100 << 20 and inside_heap >= 100 << 20
    assert after_mmapped >= 100 << 20  # its own mapping again
    assert after_heap < 100 << 20  # what the steps kept was given back


def _mapped_by_a_large_block() -> int:
    """Bytes a 100 MB malloc adds to this process's mmapped blocks while it is held (0: the heap served it)."""
    import ctypes
    import ctypes.util

    class Mallinfo2(ctypes.Structure):
        _fields_ = [
            (n, ctypes.c_size_t)
            for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
        ]

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = Mallinfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(100 << 20)
    mapped = libc.mallinfo2().hblkhd - before
    libc.free(block)
    return int(mapped)


@pytest.mark.parametrize("keep", [True, False])
def test_the_training_loop_keeps_freed_memory_only_while_its_steps_run(keep: bool) -> None:
    import torch
    from torch import nn

    from training import loop
    from training.config import LoopConfig

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1))
            self.mapped: list[int] = []

        def loss(self, batch: torch.Tensor) -> torch.Tensor:
            self.mapped.append(_mapped_by_a_large_block())
            return (self.w - batch).pow(2).mean()

    model = Probe()
    loop.train(model, lambda _: [torch.ones(1)] * 2, LoopConfig(epochs=1, reuse_freed_memory=keep), validate=None)
    assert len(model.mapped) == 2
    if keep:
        assert max(model.mapped) < 100 << 20  # the steps' large blocks come from the heap
    else:
        assert min(model.mapped) >= 100 << 20
    assert _mapped_by_a_large_block() >= 100 << 20  # and after the loop they are mapped again
