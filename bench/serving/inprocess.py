"""The event loop's CPU per request, without sockets: the real app driven in-process through ASGI.

    .venv/bin/python -m bench.serving.inprocess --path /recommend --concurrency 16 --requests 6000 \
        [--canned] [--profile 40]

Builds the service with create_app (real settings, lifespan, models, history store;
bench/serving/noop.py adds the no-op) and sends it --requests POSTs from --concurrency coroutines on one
uvloop, by user_id as bench/serving/load.py does.
Reports req/s and the loop thread's CPU per request (time.thread_time), plus the model calls' batch
size and time. --canned answers every model call with results computed once at start, which leaves
the loop's own work: the framework, parsing, the store read, the batcher hop, the response.
--profile N prints cProfile's top N functions (cumulative) of the measured requests.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


async def run(args: argparse.Namespace) -> None:
    from app.settings import Settings
    from bench.serving.loadgen import bodies_for
    from bench.serving.noop import create_with

    app = create_with(Settings())  # the service, with the benches' no-op
    to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    from_app: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    lifespan = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, to_app.get, from_app.put)
    )
    await to_app.put({"type": "lifespan.startup"})
    started = await from_app.get()
    if started["type"] != "lifespan.startup.complete":
        raise SystemExit(f"startup failed: {started}")
    requests = bodies_for(args.artifacts, args.model)  # the load bench's bodies: one query by user_id each
    bodies = [json.dumps(b).encode() for b in requests]
    served = app.state.services.loaded.models[args.model]
    engine, batcher = served.engine, served.batcher
    calls = {"n": 0, "items": 0, "seconds": 0.0, "cpu": 0.0}
    model_fn = batcher.fn
    if args.canned:
        from models.tasks.recommend import RecQuery

        canned = engine.infer(engine.prepare([RecQuery(b["queries"][0]["user_id"], k=10) for b in requests[:256]], {}))
        model_fn = lambda items: canned[: len(items)]  # noqa: E731

    def timed(items: list[Any]) -> list[Any]:
        t0, c0 = time.perf_counter(), time.thread_time()
        out = model_fn(items)
        calls["seconds"] += time.perf_counter() - t0
        calls["cpu"] += time.thread_time() - c0
        calls["n"] += 1
        calls["items"] += len(items)
        return out

    batcher.fn = timed

    async def one(body: bytes) -> int:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": args.path,
            "raw_path": args.path.encode(),
            "query_string": b"",
            "root_path": "",
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 8000),
            "state": {},
            "headers": [
                (b"host", b"bench"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *([(b"x-api-key", args.api_key.encode())] if args.api_key else []),
            ],
        }
        sent = False
        status = 0

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.Event().wait()  # no disconnect while the response is pending
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await app(scope, receive, send)
        return status

    async def client(k: int, count: int, statuses: list[int]) -> None:
        for i in range(count):
            statuses.append(await one(bodies[(k * 7919 + i) % len(bodies)]))

    for phase, n in (("warm-up", max(200, args.concurrency * 4)), ("measured", args.requests)):
        statuses: list[int] = []
        calls.update(n=0, items=0, seconds=0.0, cpu=0.0)
        profiler = cProfile.Profile() if args.profile and phase == "measured" else None
        c0, w0 = time.thread_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        await asyncio.gather(*[client(k, n // args.concurrency, statuses) for k in range(args.concurrency)])
        if profiler:
            profiler.disable()
        cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        if any(s != 200 for s in statuses):
            raise SystemExit(f"non-200 answers: {sorted(set(statuses))}")
    n_calls = max(1, calls["n"])
    print(
        f"{args.path} c={args.concurrency}{' (canned model)' if args.canned else ''}: {len(statuses) / wall:.0f} "
        f"req/s in-process; loop thread {cpu / len(statuses) * 1e6:.0f} us CPU per request; model calls: "
        f"{calls['n']}, mean batch {calls['items'] / n_calls:.1f}, {calls['seconds'] / n_calls * 1000:.2f} ms each "
        f"({calls['cpu'] / n_calls * 1000:.2f} ms of the model thread's CPU), "
        f"busy {calls['seconds'] / wall:.2f} of the run"
    )
    if profiler:
        pstats.Stats(profiler).sort_stats(os.environ.get("PSORT", "cumulative")).print_stats(args.profile)
    await to_app.put({"type": "lifespan.shutdown"})
    await from_app.get()
    await lifespan


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    p.add_argument("--model", default="sasrec-ml100k")
    p.add_argument("--path", default="/recommend", choices=["/recommend", "/bench/noop"])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--canned", action="store_true", help="answer model calls with precomputed results")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print cProfile's top N functions")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--api-key", help="sent as X-API-Key (a deployment whose by-user reads need one: set its key too)")
    args = p.parse_args()
    os.environ.update(
        {
            "SEQSERVE_ARTIFACTS_DIR": str(args.artifacts),
            "SEQSERVE_LOG_LEVEL": "WARNING",
            "SEQSERVE_TORCH_THREADS": str(args.torch_threads),
            "SEQSERVE_HISTORY_PATH": f"{tempfile.mkdtemp(prefix='seqserve-inproc-')}/h.sqlite3",
        }
    )
    import uvloop

    uvloop.run(run(args))


if __name__ == "__main__":
    main()
