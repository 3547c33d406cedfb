"""What an evaluation holds: the process's RSS after each of several `evaluate_all` rounds over many
scorers at once, as the job's validation of the prior's weights scores them, under the job's malloc
setting (`reuse_freed_memory`), each code tree in its own process.

    .venv/bin/python -m bench.training.eval_memory --items 200000 --scored 4000 \
        --variant before:/tmp/before --variant now:.

Each run builds the same seeded synthetic users (histories of 3 to 59 items over --items items) and a
network stood in for by a seeded (items, 64) table; the network's (B, V) scores are computed once a
batch and each of --weights scorers adds its weight times 20 seeded entries to a copy: the job's
prior scorers (`RecommendJob._prior_scorers`) over a stand-in for the model. Every scorer under "full",
"popularity" and "uniform". The report gives each round's RSS and seconds in each tree.
"""

from __future__ import annotations

import argparse
import json
import time
import types
from pathlib import Path
from typing import Any

from bench.trees import run_in_tree, tree_arguments, variants


def one(args: argparse.Namespace) -> dict[str, list[float]]:
    """In the tree under test (cwd): RSS (GB) and seconds after each round."""
    import torch

    from training.jobs.recommend import RecommendJob
    from training.jobs.recommend_eval import PROTOCOLS, Protocol, evaluate_all, item_counts
    from training.memory import reuse_freed_memory
    from training.splits import EvalSet

    reuse_freed_memory()  # as every training job runs
    torch.set_num_threads(args.threads)
    v, n = args.items, args.scored
    gen = torch.Generator().manual_seed(0)
    hist = [torch.randint(2, v, (int(k),), generator=gen).tolist() for k in torch.randint(3, 60, (n,), generator=gen)]
    targets = torch.randint(2, v, (n,), generator=gen).tolist()
    data = EvalSet(list(range(n)), hist, targets, [[*h, t] for h, t in zip(hist, targets, strict=True)])
    table = torch.randn(v, 64, generator=gen)

    class Net:
        """What the job's prior scorers read of a model: its config's weight, its scores, the prior's entries."""

        config = types.SimpleNamespace(transition_weight=0.0)

        def scores(self, seq: torch.Tensor) -> torch.Tensor:
            return table[seq].mean(1) @ table.T  # (B, V)

        def prior_entries(self, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return seq[:, -20:].clone(), torch.rand(len(seq), 20, generator=gen)

    net: Any = Net()  # the job's type is a trained SequentialRecommender
    scorers = RecommendJob._prior_scorers(net, [float(w) for w in range(args.weights)])
    protocols = [Protocol(p, seed=1) for p in PROTOCOLS]
    popularity = item_counts(hist, v)
    rss, seconds = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        evaluate_all(scorers, data, protocols=protocols, vocab_size=v, max_history=200, popularity=popularity)
        seconds.append(round(time.perf_counter() - t0, 2))
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        rss.append(round(pages * 4096 / 1e9, 2))
    return {"rss_gb": rss, "seconds": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=200_000)
    p.add_argument("--scored", type=int, default=4_000, help="users evaluated a round")
    p.add_argument("--weights", type=int, default=6, help="scorers sharing the network's scores")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    tree_arguments(p)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    passed = ["--items", str(args.items), "--scored", str(args.scored), "--weights", str(args.weights)]
    passed += ["--rounds", str(args.rounds), "--threads", str(args.threads)]
    report = {}
    for name, tree in variants(args):
        report[name] = run_in_tree(__file__, name, tree, passed)
        print(f"{name}: RSS after each round {report[name]['rss_gb']} GB, seconds {report[name]['seconds']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
