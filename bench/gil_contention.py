"""Does the model thread get to run while the event loop is busy? Eager against traced scores().

    .venv/bin/python bench/gil_contention.py --model sasrec-ml100k

A thread calls the served engine's scores on one batch in a loop, first alone, then beside a main
thread that runs pure Python (an event loop with work, at its worst). Eager PyTorch lets go of the
GIL inside each op and must take it back before the next, so beside busy Python it waits for the
GIL once per op; the trace (models/traced.py) takes it back once per call. Reports model calls per
second in both situations and how much Python the main thread got done meanwhile.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from models.artifact import latest_versions
from models.serving import EngineOptions
from models.tasks.recommend import RecEngine, load_artifact


def spin_for(seconds: float) -> float:
    """Pure Python for `seconds` -> millions of loop steps per second."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(1000):
            n += 1
    return n / seconds / 1e6


def calls_per_second(scores: Callable[[torch.Tensor], torch.Tensor], seq: torch.Tensor, *, seconds: float,
                     busy: bool) -> tuple[float, float]:
    """(model calls/s, main thread's Python M steps/s or 0) with the model looping in a thread."""
    stop, calls = threading.Event(), [0]

    def loop() -> None:
        with torch.inference_mode():
            while not stop.is_set():
                scores(seq)
                calls[0] += 1

    th = threading.Thread(target=loop)
    th.start()
    if busy:
        steps = spin_for(seconds)
    else:
        time.sleep(seconds)
        steps = 0.0
    stop.set()
    th.join()
    return calls[0] / seconds, steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    p.add_argument("--model", required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    folder = latest_versions(args.artifacts)[args.model]
    engines = {"eager": RecEngine(load_artifact(folder), EngineOptions(trace=False)),
               "traced": RecEngine(load_artifact(folder), EngineOptions(trace=True))}
    assert engines["traced"].scoring == "traced", engines["traced"].scoring
    print(f"main thread alone: {spin_for(args.seconds):.1f} M Python steps/s")
    print("| batch | scores | round | calls/s alone | calls/s beside busy Python | beside / alone | main M steps/s |")
    print("|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for b in args.batches:
        seq = torch.randint(2, engines["eager"].art.items.n_entities + 2, (b, 50), generator=gen)
        for r in range(args.rounds):
            for name, engine in engines.items():
                alone, _ = calls_per_second(engine.scores, seq, seconds=args.seconds, busy=False)
                beside, steps = calls_per_second(engine.scores, seq, seconds=args.seconds, busy=True)
                print(f"| {b} | {name} | {r + 1} | {alone:.0f} | {beside:.0f} | {beside / alone:.3f} | {steps:.1f} |")


if __name__ == "__main__":
    main()
