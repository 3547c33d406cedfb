"""What the sampled protocols cost at evaluation: negatives drawn for every scorer against drawn once.

    .venv/bin/python bench/eval_cost.py --config training/configs/sasrec_beauty.toml --users 8000

Scores the three baselines on a subsample of the test users under the two sampled protocols, twice in
the same run: each scorer drawing its own negatives (what every evaluation did before the shared draw) and
one draw per protocol shared by all (what the training job does now). Both give identical metrics:
the draws are seeded alike.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from training.evaluate import BASELINES, draw_negatives, evaluate
from training.jobs.recommend import RecommendJob, subsample


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--users", type=int, default=8000)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    job = RecommendJob.prepared(args.config)
    n_items = len(job.items)
    test = subsample(job.split.test, args.users, 0)
    known = job.split.train
    scorers = {name: BASELINES[name](known, n_items) for name in BASELINES}
    for negatives in ("popularity", "uniform"):
        proto = job.cfg.eval.of(negatives, 0)
        kw = {"vocab_size": n_items, "max_history": 50, "protocol": proto, "popularity": job.popularity}
        t0 = time.perf_counter()
        each = {name: evaluate(s, test, **kw) for name, s in scorers.items()}  # type: ignore[arg-type]
        t1 = time.perf_counter()
        drawn = draw_negatives(test, vocab_size=n_items, protocol=proto, popularity=job.popularity)
        t2 = time.perf_counter()
        shared = {name: evaluate(s, test, negatives=drawn, **kw) for name, s in scorers.items()}  # type: ignore[arg-type]
        t3 = time.perf_counter()
        assert each == shared
        print(f"{negatives}: {len(scorers)} scorers x {len(test.targets)} users: each draws {t1 - t0:.1f} s; "
              f"one shared draw {t3 - t1:.1f} s (the draw {t2 - t1:.1f} s): {(t1 - t0) / (t3 - t1):.2f}x")


if __name__ == "__main__":
    main()
