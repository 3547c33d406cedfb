"""Would torch.compile cut the serving model's per-call cost? Eager against compiled, same weights.

    .venv/bin/python bench/compile_scores.py --model sasrec-ml100k --threads 1

Times `model.scores` (what `models.ranking.recommend` calls) on batches of 50-item histories,
eager and `torch.compile(dynamic=True)` (inductor; needs a C compiler), in one process, and checks
both give the same scores. A lead for the hot path (docs/BENCHMARKS.md, section 3), not wired into
the service.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch

from models.artifact import latest_versions
from models.tasks.recommend import load_artifact


def ms_per_call(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, n: int = 300) -> float:
    with torch.inference_mode():
        for _ in range(20):
            fn(x)
        t0 = time.perf_counter()
        for _ in range(n):
            fn(x)
    return (time.perf_counter() - t0) / n * 1000


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 5, 16, 64])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = load_artifact(latest_versions(args.artifacts)[args.model]).model.eval()
    gen = torch.Generator().manual_seed(0)
    high = model.config.vocab_size
    t0 = time.perf_counter()
    compiled = torch.compile(model.scores, dynamic=True)
    with torch.inference_mode():
        compiled(torch.randint(2, high, (5, 50), generator=gen))
    print(f"first compiled call (compilation): {time.perf_counter() - t0:.1f} s")
    print("| batch | eager ms/call | compiled ms/call | eager / compiled | same scores |")
    print("|---|---|---|---|---|")
    for b in args.batches:
        x = torch.randint(2, high, (b, 50), generator=gen)
        with torch.inference_mode():
            same = torch.allclose(compiled(x), model.scores(x), atol=1e-4)
        eager, comp = ms_per_call(model.scores, x), ms_per_call(compiled, x)
        print(f"| {b} | {eager:.3f} | {comp:.3f} | {eager / comp:.2f} | {same} |")


if __name__ == "__main__":
    main()
