"""Training keeps large freed blocks in the heap instead of a fresh mmap per allocation."""

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
from training.memory import reuse_freed_memory

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "on":
    assert reuse_freed_memory()
block = libc.malloc(100 << 20)
held = libc.mallinfo2().hblkhd
libc.free(block)
print(held, libc.mallinfo2().arena)
"""

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc malloc's")


def _child(mode: str) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    mmapped, heap = out.split()
    return int(mmapped), int(heap)


def test_a_large_block_comes_from_the_heap_and_stays_there_after_free() -> None:
    mmapped, heap = _child("on")
    assert mmapped < 100 << 20  # not its own mapping
    assert heap >= 100 << 20  # freed, but kept for the next step's tensors


def test_without_the_setting_a_large_block_is_its_own_mapping() -> None:
    # The control: glibc's default, which the first test must differ from.
    mmapped, heap = _child("off")
    assert mmapped >= 100 << 20
    assert heap < 100 << 20
