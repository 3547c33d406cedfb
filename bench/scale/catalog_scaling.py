"""Score + top-K cost per query against synthetic catalogs, to show how it grows with their size.

    .venv/bin/python -m bench.scale.catalog_scaling --items 10000 100000 1000000 --batch 64 --threads 2
    .venv/bin/python -m bench.scale.catalog_scaling --artifact runs/arts1m/sasrec-1m-items/<version> --batch 8

A SASRec of the Beauty configuration (d=64, 2 layers, 50 positions) with random weights; each
query has a 50-item history, seen-item exclusion and top-10 (models.ranking.recommend, the
serving path). Beside it, on the same batch: the encoder alone (the part that does not depend on
the catalog), the scores alone, the top-10 of those scores by torch.topk over whole rows against
models.ranking.top_k (block maxima, what serving uses), and the same ranking through coarse bfloat16
scores with a certificate (models.coarse.CoarseRanker, what serving uses from
models.queries.COARSE_FROM items on where it is faster at load), checked to give the same items.
With --artifact: a trained model and its users' stored histories, how many rows the certificate
sends back to the float32 pass at 32, 64 and 128 candidates, and both paths' time; and what each
answer's reference list (its floor online, models.ranking.Popular) adds to the float32 path, alternated.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch

from models.coarse import CoarseRanker
from models.ids import N_SPECIAL
from models.ranking import FLOOR_HEAD, Popular, recommend, top_k
from models.sasrec import SASRec, SASRecConfig
from models.tasks.recommend import load_artifact


def timed(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def trained(folder: Path, *, users: int, batch: int, repeats: int) -> None:
    """The served ranking of a trained artifact for its stored users: float32 against coarse, and how
    many rows the certificate leaves to the float32 pass at each candidate count."""
    art = load_artifact(folder)
    model = art.model.eval()
    names = list(art.histories.users())
    rows = []
    for user in random.Random(0).sample(names, min(users, len(names))):
        x = art.histories.get(user).items  # type: ignore[union-attr]
        rows.append(x[(x >= N_SPECIAL) & (x < model.config.vocab_size)].tolist())
    batches = [rows[i : i + batch] for i in range(0, len(rows), batch)]
    out: dict[str, object] = {"artifact": str(folder), "items": model.config.vocab_size - N_SPECIAL, "users": len(rows)}
    with torch.inference_mode():
        for candidates in (32, 64, 128):
            ranker = CoarseRanker(model, model.query, candidates=candidates)
            for b in batches:
                seen = [True] * len(b)
                want = recommend(model, b, k=10, exclude_seen=seen, requested=[[]] * len(b))
                got = recommend(model, b, k=10, exclude_seen=seen, requested=[[]] * len(b), rank=ranker)
                assert torch.allclose(want.scores, got.scores, atol=1e-5)
            out[f"fallback_rows_at_{candidates}"] = ranker.fallbacks
        b = batches[0]
        served = functools.partial(recommend, model, b, k=10, exclude_seen=[True] * len(b), requested=[[]] * len(b))
        full = timed(lambda: served(rank=None), repeats)
        coarse = timed(lambda: served(rank=ranker), repeats)
        floor = Popular.of(art.histories.by_count(model.config.vocab_size, FLOOR_HEAD))
        plain, with_floor = [], []
        for _ in range(repeats):  # alternated, the best of each
            plain.append(timed(lambda: served(rank=None), 1))
            with_floor.append(timed(lambda: served(rank=None, floor=floor).floor.tolist(), 1))  # type: ignore[union-attr]
    out.update(
        float32_ms_per_query=round(full / len(b) * 1000, 3),
        coarse_ms_per_query=round(coarse / len(b) * 1000, 3),
        speedup=round(full / coarse, 2),
        floor_us_per_query=round((min(with_floor) - min(plain)) / len(b) * 1e6, 1),
        with_floor_over_without=round(min(with_floor) / min(plain), 3),
    )
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--items", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--history", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--artifact", type=Path, help="a trained recommendation artifact's version folder instead")
    p.add_argument("--users", type=int, default=512, help="with --artifact: stored users sampled (seed 0)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.artifact:
        trained(args.artifact, users=args.users, batch=args.batch, repeats=args.repeats)
        return
    rows = []
    base = None
    for n in args.items:
        torch.manual_seed(0)
        model = SASRec(SASRecConfig(vocab_size=n + 2, max_len=args.history)).eval()
        hist = torch.randint(2, n + 2, (args.batch, args.history)).tolist()
        seq = torch.tensor(hist)
        with torch.inference_mode():
            enc = timed(lambda: model(seq), args.repeats)  # noqa: B023
            ranker = CoarseRanker(model, model.query)
            served = functools.partial(
                recommend, model, hist, k=10, exclude_seen=[True] * args.batch, requested=[[]] * args.batch
            )
            full = timed(lambda: served(rank=None), args.repeats)  # noqa: B023
            coarse = timed(lambda: served(rank=ranker), args.repeats)  # noqa: B023
            want, got = served(rank=None), served(rank=ranker)
            assert torch.equal(want.indices, got.indices) and torch.allclose(want.scores, got.scores, atol=1e-5)
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
            "coarse_ms_per_query": round(coarse / args.batch * 1000, 4),
            "coarse_speedup": round(full / coarse, 2),
            "coarse_fallback_rows": ranker.fallbacks,
            "vs_smallest": round(per_q / base, 2),
            "items_ratio": n / args.items[0],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        "\n| catalog | ms/query (score + exclusions + top-10) | encoder only | scores only | top-10: torch.topk"
        " | top-10: block maxima | coarse ranking (certified) | float32 / coarse | x smallest | catalog x |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['items']:,} | {r['ms_per_query']:.3f} | {r['encoder_ms_per_query']:.3f}"
            f" | {r['scores_ms_per_query']:.3f} | {r['topk_whole_ms_per_query']:.3f}"
            f" | {r['top_k_blocks_ms_per_query']:.3f} | {r['coarse_ms_per_query']:.3f} | {r['coarse_speedup']:.2f}"
            f" | {r['vs_smallest']:.1f}"
            f" | {r['items_ratio']:.0f} |"
        )


if __name__ == "__main__":
    main()
