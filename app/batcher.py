"""Dynamic micro-batching, framework-free: concurrent requests share one model call.

Requests wait in a bounded queue; one larger than a batch waits as chunks of at most a batch each.
A request (or chunk) whose caller has gone (cancelled, timed out, or its `abandoned()` true: the
client hung up) is dropped at its turn, never run. The worker takes the oldest, adds whatever
else is already queued, and flushes at once when nothing else waits (so a lone request pays no
batching delay);
when more is queued but the batch is not full, it waits up to `max_wait_ms` for more. The model
call runs in one worker thread, off the event loop. A failing batch is split in halves until the
failing request is alone, so a bad request fails alone at a bounded cost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from app.limits import BatchPolicy

Q = TypeVar("Q")
R = TypeVar("R")
log = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The queue holds `max_queue` requests already."""


class BatchTimeoutError(TimeoutError):
    """The request was not answered within its timeout."""


class AbandonedError(RuntimeError):
    """The request's caller had gone when its turn came: it was never run."""


class BatcherStoppedError(RuntimeError):
    """The batcher was stopped (its model version was swapped out): it takes no more work."""


@dataclass
class _Pending(Generic[Q, R]):
    items: Sequence[Q]
    future: asyncio.Future[list[R]]
    abandoned: Callable[[], bool] | None = None  # true once the caller has gone (its client hung up)
    enqueued: float = field(default_factory=time.monotonic)


def _expire(future: asyncio.Future[list[R]], timeout: float) -> None:
    if not future.done():
        future.set_exception(BatchTimeoutError(f"no answer within {timeout:.3f}s"))


class MicroBatcher(Generic[Q, R]):
    def __init__(
        self,
        fn: Callable[[list[Q]], list[R]],
        policy: BatchPolicy = BatchPolicy(),
        *,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self.fn = fn
        self.max_batch_size = policy.max_batch_size
        self.max_wait = policy.max_wait_ms / 1000.0
        self.enabled = policy.enabled
        max_queue = policy.max_queue
        self.on_batch = on_batch  # (items in the batch, seconds in the model call)
        # None is the stop sentinel: queued behind every request already accepted.
        self._queue: asyncio.Queue[_Pending[Q, R] | None] = asyncio.Queue(maxsize=max_queue)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batcher")
        self._worker: asyncio.Task[None] | None = None
        self._stopped = False
        self.restarts = 0  # times the worker task died and was started again

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def start(self) -> None:
        """Start the worker task, or start it again if it died (a bug: logged, counted, survived)."""
        if self._stopped:
            raise BatcherStoppedError("this batcher was stopped")
        if self._worker is not None and self._worker.done():
            exc = None if self._worker.cancelled() else self._worker.exception()
            log.error("batcher worker died (%r); starting a new one", exc)
            self.restarts += 1
            self._worker = None
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Answer every request already accepted (queued or in the model), then stop the worker.

        After this, submit() raises BatcherStoppedError: a stopped batcher never takes work again.
        """
        if self._stopped:
            return
        self._stopped = True
        if self._worker is not None and not self._worker.done():
            await self._queue.put(None)
            await self._worker
        self._worker = None
        while not self._queue.empty():  # left behind by a worker that died: never leave a caller waiting
            p = self._queue.get_nowait()
            if p is not None and not p.future.done():
                p.future.set_exception(BatcherStoppedError("the batcher stopped before answering"))
        self._executor.shutdown(wait=True)

    async def submit(
        self, items: Sequence[Q], timeout: float | None = None, *, abandoned: Callable[[], bool] | None = None
    ) -> list[R]:
        """Queue `items` (one request) and wait for their results, in order. When `abandoned()` is true
        at the request's turn (or at a chunk's), it is not run: AbandonedError."""
        if self._stopped:
            raise BatcherStoppedError("this batcher was stopped")
        loop = asyncio.get_running_loop()
        if not self.enabled:
            return await asyncio.wait_for(self._call(loop, list(items)), timeout)
        if len(items) <= self.max_batch_size:
            pending: _Pending[Q, R] = _Pending(items, loop.create_future(), abandoned)
            try:
                self._queue.put_nowait(pending)
            except asyncio.QueueFull:
                raise QueueFullError(f"{self._queue.maxsize} requests already queued") from None
            self.start()
            if timeout is None:
                return await pending.future
            # A timer on the future, not asyncio.wait_for: that wraps every request in a new task,
            # a measurable cost at hundreds of requests a second. The worker skips a timed-out request.
            timer = loop.call_later(timeout, _expire, pending.future, timeout)
            try:
                return await pending.future
            finally:
                timer.cancel()
        return await self._submit_chunks(loop, items, timeout, abandoned)

    async def _submit_chunks(
        self,
        loop: asyncio.AbstractEventLoop,
        items: Sequence[Q],
        timeout: float | None,
        abandoned: Callable[[], bool] | None,
    ) -> list[R]:
        """A request larger than a batch, queued as chunks of at most max_batch_size queries: when its
        client goes (the caller is cancelled) or it times out, the chunks the model has not run yet
        are dropped, instead of one model call over all of it that nothing can stop."""
        size = self.max_batch_size
        chunks = [_Pending(items[i : i + size], loop.create_future(), abandoned) for i in range(0, len(items), size)]
        if self._queue.maxsize - self._queue.qsize() < len(chunks):
            raise QueueFullError(f"no room for {len(chunks)} chunks of {size} queries in the queue")
        for chunk in chunks:
            self._queue.put_nowait(chunk)
        self.start()
        timers = [loop.call_later(timeout, _expire, c.future, timeout) for c in chunks] if timeout else []
        try:
            parts = await asyncio.gather(*(c.future for c in chunks))
            return [r for part in parts for r in part]
        finally:
            for t in timers:
                t.cancel()
            for c in chunks:  # after a failure, a timeout or a cancellation: the rest is never run
                if not c.future.done():
                    c.future.cancel()

    async def _call(self, loop: asyncio.AbstractEventLoop, items: list[Q]) -> list[R]:
        t0 = time.perf_counter()
        out = await loop.run_in_executor(self._executor, self.fn, items)
        if len(out) != len(items):
            raise RuntimeError(f"model returned {len(out)} results for {len(items)} queries")
        if self.on_batch:
            self.on_batch(len(items), time.perf_counter() - t0)
        return out

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self._queue.get()
            if first is None:
                return
            batch = [first]
            size = len(first.items)
            deadline = first.enqueued + self.max_wait
            stopping = False
            while size < self.max_batch_size:
                try:
                    nxt = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    # Nothing else waits: flush now unless others arrived meanwhile and time is left.
                    if len(batch) == 1 or time.monotonic() >= deadline:
                        break
                    try:
                        nxt = await asyncio.wait_for(self._queue.get(), deadline - time.monotonic())
                    except TimeoutError:
                        break
                if nxt is None:
                    stopping = True
                    break
                if size + len(nxt.items) > self.max_batch_size:
                    # Too big to join: it opens the next batch.
                    await self._flush(loop, batch)
                    batch, size, deadline = [nxt], len(nxt.items), nxt.enqueued + self.max_wait
                    continue
                batch.append(nxt)
                size += len(nxt.items)
            await self._flush(loop, batch)
            if stopping:
                return

    async def _flush(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending[Q, R]]) -> None:
        for p in batch:
            if p.abandoned is not None and not p.future.done() and p.abandoned():
                p.future.set_exception(AbandonedError("the client went away before its turn"))
        live = [p for p in batch if not p.future.done()]
        if not live:
            return
        items = [it for p in live for it in p.items]
        try:
            results = await self._call(loop, items)
        except Exception as exc:
            if len(live) == 1:
                if not live[0].future.done():
                    live[0].future.set_exception(exc)
                return
            # Isolate the failing request by halving: one bad request among n costs about 2*log2(n)
            # more calls, not n, while every other request waits.
            half = len(live) // 2
            await self._flush(loop, live[:half])
            await self._flush(loop, live[half:])
            return
        pos = 0
        for p in live:
            n = len(p.items)
            if not p.future.done():
                p.future.set_result(results[pos : pos + n])
            pos += n
