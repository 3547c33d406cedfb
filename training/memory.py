"""Keep freed memory in the process, so training's large per-step tensors stop costing page faults.

glibc's malloc serves every block over 32 MB with a fresh mmap and unmaps it on free, so a full
softmax's (rows, catalog) logits and their gradients are faulted in page by page at every step
(docs/decisions/reuse-freed-memory.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger(__name__)

# mallopt parameters, from glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4

KEEP_BYTES = 2**31 - 1  # freed memory at the heap's top returned to the system only above this (mallopt takes an int)
TOP_PAD_BYTES = 64 << 20  # grow the heap in steps of at least this much


def reuse_freed_memory() -> bool:
    """Serve large blocks from the heap and keep what is freed; False where malloc is not glibc's."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    ok = all(
        libc.mallopt(param, value) == 1
        for param, value in ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, KEEP_BYTES), (M_TOP_PAD, TOP_PAD_BYTES))
    )
    if not ok:
        log.warning("mallopt refused a setting: large tensors keep their mmap per allocation")
    return ok
