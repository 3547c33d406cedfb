"""Keep freed memory in the process while training steps run, so their large tensors stop costing page
faults, and give it back when the steps end.

glibc's malloc serves every block over 32 MB with a fresh mmap and unmaps it on free, so a full
softmax's (rows, catalog) logits and their gradients are faulted in page by page at every step
(docs/decisions/reuse-freed-memory.md). Kept for the whole job, the heap also held every one-off
peak of the phases around the loop (loading, the baselines' fits, the evaluation), and the job's
peak became their sum: the setting now holds only while steps run.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import platform
from collections.abc import Iterator

log = logging.getLogger(__name__)

# mallopt parameters, from glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4

KEEP_BYTES = 2**31 - 1  # freed memory at the heap's top returned to the system only above this (mallopt takes an int)
TOP_PAD_BYTES = 64 << 20  # grow the heap in steps of at least this much
# glibc's own values (mallopt(3)), set again when the steps end
DEFAULTS = ((M_MMAP_MAX, 65536), (M_TRIM_THRESHOLD, 128 * 1024), (M_TOP_PAD, 128 * 1024))
KEEPING = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, KEEP_BYTES), (M_TOP_PAD, TOP_PAD_BYTES))


def _libc() -> ctypes.CDLL | None:
    return ctypes.CDLL(ctypes.util.find_library("c")) if platform.libc_ver()[0] == "glibc" else None


def _set(libc: ctypes.CDLL, settings: tuple[tuple[int, int], ...]) -> bool:
    return all(libc.mallopt(param, value) == 1 for param, value in settings)


def reuse_freed_memory() -> bool:
    """Serve large blocks from the heap and keep what is freed; False where malloc is not glibc's."""
    libc = _libc()
    if libc is None:
        return False
    ok = _set(libc, KEEPING)
    if not ok:
        log.warning("mallopt refused a setting: large tensors keep their mmap per allocation")
    return ok


def give_back_freed_memory() -> bool:
    """glibc's defaults again (large blocks mapped and unmapped one by one), and the heap's free pages
    returned to the system (malloc_trim); False where malloc is not glibc's."""
    libc = _libc()
    if libc is None:
        return False
    ok = _set(libc, DEFAULTS)
    libc.malloc_trim(0)
    return ok


@contextlib.contextmanager
def steps_keep_freed_memory(enabled: bool = True) -> Iterator[None]:
    """reuse_freed_memory() inside, give_back_freed_memory() on the way out (when `enabled`)."""
    if not enabled:
        yield
        return
    reuse_freed_memory()
    try:
        yield
    finally:
        give_back_freed_memory()
