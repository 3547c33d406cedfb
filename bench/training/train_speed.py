"""Training throughput of a recommendation config on a log: training windows a second through the job's
own loop (optimizer, weight averaging, schedule), each code tree in its own process, alternated.

    .venv/bin/python -m bench.training.train_speed --config training/configs/sasrec_beauty.toml \
        --data ../shared/data/amazon-beauty-5core/beauty_5core.txt \
        --variant before:/tmp/before --variant now:. --rounds 2 --batches 200

Each run loads and splits the log with that tree's job (`RecommendJob.prepared`), builds the model and
its training batches as the job does (epoch 1's order, the config's seed), trains on the first
--warmup batches untimed, then times `training.loop.train` over the next --batches: one epoch of
them, no validation. A variant is `name:path` (a checkout, e.g. a `git worktree` of an older
commit). The report gives each run, each variant's median and each variant's ratio to the first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench.trees import run_in_tree, tree_arguments, variants

ROOT = Path(__file__).resolve().parents[2]


def one(args: argparse.Namespace) -> dict[str, float]:
    """In the tree under test (cwd): windows a second over --batches of epoch 1's batches."""
    import dataclasses

    import torch

    from training.config import read_raw
    from training.jobs.recommend import RecommendJob
    from training.loop import seed_everything, train
    from training.memory import reuse_freed_memory

    raw = read_raw(Path(args.config), list(args.set))
    job = RecommendJob(RecommendJob.parse_config(raw), out_root=Path("/nonexistent"), data_path=Path(args.data))
    t = job.cfg.train
    if t.reuse_freed_memory:
        reuse_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    job.prepare_data()
    job._validation_baselines = lambda *_: None  # type: ignore[method-assign]  # the batches only
    seed_everything(t.seed)
    model = job.build_model().to(job.device)
    batches = job.train_batches(model)(torch.Generator().manual_seed(t.seed))
    warm, timed = batches[: args.warmup], batches[args.warmup : args.warmup + args.batches]
    cfg = dataclasses.replace(t, epochs=1, max_minutes=1e6)
    train(model, lambda g: warm, cfg, validate=None, device=job.device)
    t0 = time.perf_counter()
    train(model, lambda g: timed, cfg, validate=None, device=job.device)
    seconds = time.perf_counter() - t0
    rows = sum(len(b) for b in timed)
    return {"windows_per_s": rows / seconds, "seconds": seconds, "windows": rows, "items": len(job.items)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--set", action="append", default=[], help="config overrides, as the training CLI's --set")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    tree_arguments(p)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    trees = variants(args)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    data, config = str(Path(args.data).resolve()), str(Path(args.config).resolve())
    for r in range(args.rounds):
        for name, tree in trees:
            flags = ["--config", config, "--data", data, "--batches", str(args.batches), "--warmup", str(args.warmup)]
            flags += ["--threads", str(args.threads), *[a for s in args.set for a in ("--set", s)]]
            got = run_in_tree(__file__, name, tree, flags)
            runs[name].append(got)
            print(
                f"round {r + 1} {name}: {got['windows_per_s']:.0f} windows/s "
                f"({got['windows']} in {got['seconds']:.1f} s)"
            )
    first = statistics.median(x["windows_per_s"] for x in runs[trees[0][0]])
    report = {
        name: {
            "median_windows_per_s": round(statistics.median(x["windows_per_s"] for x in got), 1),
            "ratio": round(statistics.median(x["windows_per_s"] for x in got) / first, 3),
            "runs": got,
        }
        for name, got in runs.items()
    }
    for name, rep in report.items():
        print(f"{name}: median {rep['median_windows_per_s']:.0f} windows/s, {rep['ratio']:.2f}x {trees[0][0]}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
