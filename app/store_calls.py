"""The request path's store calls, off the event loop in two pools of their own: a read never waits behind a
write. A write may hold its thread for SEQSERVE_REDIS_WAIT_MS (a Redis WAIT for a replica that is not
there); in one shared pool a dozen of those held every thread and stalled every user's reads
(docs/decisions/store-threads.md). Background work (the production loop's sums, loads) keeps asyncio's
default pool, so it never takes a thread from either."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

R = TypeVar("R")
# Reads are short (one round trip a node); writes may wait for replicas: more of them may be in flight.
READ_THREADS = 8
WRITE_THREADS = 16
_READS = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="store-read")
_WRITES = ThreadPoolExecutor(max_workers=WRITE_THREADS, thread_name_prefix="store-write")


async def read(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """`fn(*args, **kwargs)`, a store read, in the reads' pool."""
    return await asyncio.get_running_loop().run_in_executor(_READS, partial(fn, *args, **kwargs))


async def write(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """`fn(*args, **kwargs)`, a store write, in the writes' pool."""
    return await asyncio.get_running_loop().run_in_executor(_WRITES, partial(fn, *args, **kwargs))
