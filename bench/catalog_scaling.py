"""Score + top-K cost per query against synthetic catalogs, to show how it grows with their size.

    .venv/bin/python bench/catalog_scaling.py --items 10000 100000 1000000 --batch 64 --threads 2

A SASRec of the Beauty configuration (d=64, 2 layers, 50 positions) with random weights; each
query has a 50-item history, seen-item exclusion and top-10 (models.ranking.recommend, the
serving path). Beside it, on the same batch: the encoder alone (the part that does not depend on
the catalog), the scores alone, and the top-10 of those scores by torch.topk over whole rows against
models.ranking.top_k (block maxima, what serving uses).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from models.ranking import recommend, top_k
from models.sasrec import SASRec, SASRecConfig


def timed(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--items", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--history", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    base = None
    for n in args.items:
        torch.manual_seed(0)
        model = SASRec(SASRecConfig(vocab_size=n + 2, max_len=args.history)).eval()
        hist = torch.randint(2, n + 2, (args.batch, args.history)).tolist()
        seq = torch.tensor(hist)
        with torch.inference_mode():
            enc = timed(lambda: model(seq), args.repeats)  # noqa: B023
            full = timed(
                lambda: recommend(model, hist, k=10, exclude_seen=[True] * args.batch, requested=[[]] * args.batch),  # noqa: B023
                args.repeats,
            )
            scores = model.scores(seq)
            score_only = timed(lambda: model.scores(seq), args.repeats)  # noqa: B023
            whole = timed(lambda: scores.topk(10, dim=1), args.repeats)  # noqa: B023
            blocked = timed(lambda: top_k(scores, 10), args.repeats)  # noqa: B023
            assert torch.equal(scores.topk(10, dim=1).values, top_k(scores, 10)[0])
        per_q = full / args.batch * 1000
        base = base or per_q
        ms = 1000 / args.batch
        row = {
            "items": n,
            "ms_per_query": round(per_q, 4),
            "encoder_ms_per_query": round(enc * ms, 4),
            "scores_ms_per_query": round(score_only * ms, 4),
            "topk_whole_ms_per_query": round(whole * ms, 4),
            "top_k_blocks_ms_per_query": round(blocked * ms, 4),
            "vs_smallest": round(per_q / base, 2),
            "items_ratio": n / args.items[0],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        "\n| catalog | ms/query (score + exclusions + top-10) | encoder only | scores only | top-10: torch.topk"
        " | top-10: block maxima (served) | x smallest | catalog x |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['items']:,} | {r['ms_per_query']:.3f} | {r['encoder_ms_per_query']:.3f}"
            f" | {r['scores_ms_per_query']:.3f} | {r['topk_whole_ms_per_query']:.3f}"
            f" | {r['top_k_blocks_ms_per_query']:.3f} | {r['vs_smallest']:.1f}"
            f" | {r['items_ratio']:.0f} |"
        )


if __name__ == "__main__":
    main()
