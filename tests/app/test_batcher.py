"""The micro-batcher on its own: no FastAPI, a plain function as the model."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from app.batcher import (
    AbandonedError,
    BatcherStoppedError,
    BatchTimeoutError,
    MicroBatcher,
    QueueFullError,
)
from app.limits import BatchPolicy
from tests.servers import wait_until_async


class Model:
    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[list[int]] = []
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()
        self.entered = 0  # calls that reached the model (some may be waiting at the gate)

    def __call__(self, items: list[int]) -> list[int]:
        self.entered += 1
        self.gate.wait()
        time.sleep(self.delay)
        if any(i < 0 for i in items):
            raise ValueError("negative")
        self.calls.append(list(items))
        return [i * 10 for i in items]


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_lone_request_flushes_at_once() -> None:
    async def go() -> None:
        b = MicroBatcher(Model(), BatchPolicy(max_wait_ms=600_000))
        # A batcher that waited for company would hold it ten minutes: the 30 s guard would fire.
        assert await asyncio.wait_for(b.submit([1, 2]), 30) == [10, 20]
        await b.stop()

    run(go())


def test_concurrent_requests_share_calls_and_keep_order() -> None:
    async def go() -> Model:
        m = Model(delay=0.02)
        b = MicroBatcher(m, BatchPolicy(max_batch_size=64, max_wait_ms=5))
        out = await asyncio.gather(*[b.submit([i, i + 100]) for i in range(40)])
        assert out == [[i * 10, (i + 100) * 10] for i in range(40)]
        await b.stop()
        return m

    m = run(go())
    assert len(m.calls) < 40 and max(len(c) for c in m.calls) > 2
    assert all(len(c) <= 64 for c in m.calls)


def test_a_failing_request_fails_alone() -> None:
    async def go() -> list[object]:
        m = Model()
        m.gate.clear()
        b = MicroBatcher(m, BatchPolicy(max_wait_ms=50))
        tasks = [asyncio.create_task(b.submit(x)) for x in ([1], [-1], [2])]
        await wait_until_async(lambda: m.entered == 1)
        m.gate.set()
        res = await asyncio.gather(*tasks, return_exceptions=True)
        await b.stop()
        return res

    ok1, bad, ok2 = run(go())
    assert ok1 == [10] and ok2 == [20] and isinstance(bad, ValueError)


def test_queue_bound() -> None:
    async def go() -> None:
        m = Model()
        m.gate.clear()  # the model hangs until released
        b = MicroBatcher(m, BatchPolicy(max_queue=2, max_wait_ms=0))
        first = asyncio.create_task(b.submit([1]))
        await wait_until_async(lambda: m.entered == 1)  # the worker took it and is blocked in the model
        waiting = [asyncio.create_task(b.submit([2])), asyncio.create_task(b.submit([3]))]
        await wait_until_async(lambda: b.depth == 2)
        with pytest.raises(QueueFullError):
            await b.submit([4])
        m.gate.set()
        assert await first == [10]
        assert [await w for w in waiting] == [[20], [30]]
        await b.stop()

    run(go())


def test_timeout() -> None:
    async def go() -> None:
        m = Model()
        m.gate.clear()
        b = MicroBatcher(m)
        with pytest.raises(BatchTimeoutError):
            await b.submit([1], timeout=0.05)
        m.gate.set()
        assert await b.submit([2], timeout=5) == [20]
        await b.stop()

    run(go())


def test_result_count_is_checked() -> None:
    async def go() -> None:
        b = MicroBatcher(lambda items: items[:-1])
        with pytest.raises(RuntimeError, match="returned 1 results for 2"):
            await b.submit([1, 2])
        await b.stop()

    run(go())


def test_batching_off_calls_per_request() -> None:
    async def go() -> Model:
        m = Model(delay=0.01)
        b = MicroBatcher(m, BatchPolicy(enabled=False))
        await asyncio.gather(*[b.submit([i]) for i in range(5)])
        await b.stop()
        return m

    assert len(run(go()).calls) == 5


def test_stop_answers_everything_accepted() -> None:
    async def go() -> list[list[int]]:
        m = Model()
        m.gate.clear()
        b = MicroBatcher(m, BatchPolicy(max_batch_size=1))
        tasks = [asyncio.create_task(b.submit([i])) for i in range(5)]
        await wait_until_async(lambda: m.entered == 1 and b.depth == 4)
        stopper = asyncio.create_task(b.stop())
        await wait_until_async(lambda: b.stopped and b.depth == 5)  # its end marker behind the 4 waiting
        m.gate.set()
        await stopper
        return [await t for t in tasks]

    assert run(go()) == [[0], [10], [20], [30], [40]]


def test_a_stopped_batcher_refuses_work_and_never_restarts() -> None:
    async def go() -> None:
        b = MicroBatcher(Model())
        assert await b.submit([1]) == [10]
        await b.stop()
        with pytest.raises(BatcherStoppedError):
            await b.submit([2])
        with pytest.raises(BatcherStoppedError):
            b.start()
        assert b.stopped and b._worker is None

    run(go())


def test_a_dead_worker_is_restarted() -> None:
    async def go() -> MicroBatcher[int, int]:
        b = MicroBatcher(Model())
        assert await b.submit([1]) == [10]
        assert b._worker is not None
        b._worker.cancel()  # the worker task dies (a bug, or a cancellation leaking in)
        await asyncio.sleep(0)
        assert await b.submit([2], timeout=2) == [20]  # a new worker answers
        await b.stop()
        return b

    assert run(go()).restarts == 1


def test_default_cap_follows_the_device() -> None:
    """Unset, a model call takes up to 32 queries on the CPU (cohorts that alternate with the event
    loop) and 256 on CUDA; a value that is set holds on both."""
    from app.limits import CPU_MAX_BATCH
    from app.settings import Settings

    assert Settings().batch_policy("cpu").max_batch_size == CPU_MAX_BATCH == 32
    assert Settings().batch_policy("cuda").max_batch_size == BatchPolicy().max_batch_size == 256
    for device in ("cpu", "cuda"):
        policy = Settings(max_batch_size=100, max_wait_ms=7).batch_policy(device)
        assert (policy.max_batch_size, policy.max_wait_ms) == (100, 7)


def test_a_failing_request_in_a_full_batch_costs_a_bounded_number_of_calls() -> None:
    """31 good requests and one bad: found by halving, not by retrying each of the 32 alone."""
    attempts: list[int] = []

    def model(items: list[int]) -> list[int]:
        attempts.append(len(items))
        if any(i < 0 for i in items):
            raise ValueError("negative")
        return [i * 10 for i in items]

    async def go() -> list[object]:
        gate = asyncio.Event()
        b = MicroBatcher(model, BatchPolicy(max_batch_size=32, max_wait_ms=200))
        block = asyncio.get_running_loop().run_in_executor(b._executor, lambda: time.sleep(0.2))  # model busy
        tasks = [asyncio.create_task(b.submit([-1] if n == 17 else [n])) for n in range(32)]
        await block
        gate.set()
        res = await asyncio.gather(*tasks, return_exceptions=True)
        await b.stop()
        return res

    res = run(go())
    assert isinstance(res[17], ValueError) and [r for n, r in enumerate(res) if n != 17] == [
        [n * 10] for n in range(32) if n != 17
    ]
    assert attempts[0] == 32 and len(attempts) <= 11, attempts


def test_a_request_larger_than_a_batch_runs_in_chunks_and_stops_when_its_caller_goes() -> None:
    async def go() -> tuple[list[int], list[list[int]], list[list[int]]]:
        m = Model()
        b = MicroBatcher(m, BatchPolicy(max_batch_size=8, max_wait_ms=1))
        whole = await b.submit(list(range(20)))
        calls = list(m.calls)
        m.calls.clear()
        m.gate.clear()
        task = asyncio.create_task(b.submit(list(range(100, 140))))  # 5 chunks
        await wait_until_async(lambda: m.entered == 4)  # the first chunk is in the model, behind the gate
        task.cancel()
        m.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await b.stop()  # answers whatever is still queued: a cancelled chunk must not be among it
        return whole, calls, m.calls

    whole, calls, after_cancel = run(go())
    assert whole == [i * 10 for i in range(20)] and [len(c) for c in calls] == [8, 8, 4]
    assert after_cancel == [list(range(100, 108))]  # only the chunk already running


def test_chunks_need_room_in_the_queue() -> None:
    async def go() -> None:
        b = MicroBatcher(Model(), BatchPolicy(max_batch_size=2, max_queue=3))
        with pytest.raises(QueueFullError):
            await b.submit(list(range(8)))  # 4 chunks, 3 places
        assert await b.submit([1, 2, 3, 4, 5]) == [10, 20, 30, 40, 50]
        await b.stop()

    run(go())


def test_a_request_whose_client_has_gone_is_not_run_at_its_turn() -> None:
    async def go() -> tuple[object, list[list[int]]]:
        m = Model()
        m.gate.clear()
        b = MicroBatcher(m, BatchPolicy(max_batch_size=4, max_wait_ms=1))
        gone = False
        busy = asyncio.create_task(b.submit([1]))
        await wait_until_async(lambda: m.entered == 1)  # the model is busy with [1]
        left = asyncio.create_task(b.submit([2, 3, 4, 5, 6, 7], abandoned=lambda: gone))  # two chunks, queued
        await wait_until_async(lambda: b.depth == 2)
        gone = True
        m.gate.set()
        await busy
        res = await asyncio.gather(left, return_exceptions=True)
        await b.stop()
        return res[0], m.calls

    res, calls = run(go())
    assert isinstance(res, AbandonedError) and calls == [[1]]
