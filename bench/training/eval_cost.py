"""What evaluating a recommender costs a user at a catalog size: milliseconds a user of `evaluate_all` for
a network-like scorer and each baseline, under the three protocols, each code tree in its own process.

    .venv/bin/python -m bench.training.eval_cost --items 500000 --scored 2000 \
        --variant before:/tmp/before --variant now:.

Each run builds the same seeded synthetic log in its tree (--users histories of 3 to 39 items drawn
from a Zipf-like popularity over --items items), fits the three baselines on it (popularity,
transitions, item-kNN), and times `training.jobs.recommend_eval.evaluate_all` on the first --scored users,
one scorer at a time, under "full", "popularity" and "uniform" (100 negatives each): the network is
stood in for by a seeded (items, 64) table scored by a dot product with the mean of the history's rows,
which costs what SASRec's (B, V) scores do after its encoder. The report gives each run and, per
scorer (and per baseline's fit, in seconds), each variant's median and its ratio to the first variant's.

    .venv/bin/python -m bench.training.eval_cost --artifact runs/job50m/arts/sasrec-beauty/<version> \
        --config training/configs/sasrec_beauty.toml --data runs/log50m/parquet --set eval.test_users=20000 \
        --set train.max_minutes=30

With --artifact, the test phase of a trained recommender as its job runs it (`RecommendJob.test`: the
baselines fitted again within the job's share of the budget, then the model and every baseline under
every protocol on the seeded sample of test users), on the log and config it was trained with, with
no deadline: the seconds of the fits and of the scoring, and the users scored.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench.trees import run_in_tree, tree_arguments, variants


def one(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """In the tree under test (cwd): milliseconds a scored user, per scorer; seconds each baseline's fit."""
    import torch

    from training.jobs.recommend_eval import BASELINES, Protocol, ScoreFn, evaluate_all, item_counts
    from training.memory import reuse_freed_memory
    from training.splits import EvalSet

    reuse_freed_memory()  # as a training job does by default
    if args.threads:
        torch.set_num_threads(args.threads)
    v, gen = args.items, torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 40, (args.users,), generator=gen)
    weights = 1.0 / torch.arange(1, v - 2, dtype=torch.float64) ** 0.8  # items 3..v-1 (0-2 are specials)
    flat = torch.multinomial(weights, int(lengths.sum()), replacement=True, generator=gen) + 3
    known = [s.tolist() for s in flat.split(lengths.tolist())]
    n = min(args.scored, args.users)
    targets = torch.randint(3, v, (n,), generator=gen).tolist()
    hist = known[:n]
    data = EvalSet(list(range(n)), hist, targets, [[*h, t] for h, t in zip(hist, targets, strict=True)])
    table = torch.randn(v, 64, generator=gen)

    def network(seq: torch.Tensor) -> torch.Tensor:
        return table[seq].mean(1) @ table.T  # (B, V)

    scorers: dict[str, ScoreFn] = {"network": network}
    fit_s = {}
    for name, fit in BASELINES.items():
        t0 = time.perf_counter()
        scorers[name] = fit(known, v)
        fit_s[name] = time.perf_counter() - t0
    protocols = [Protocol(p, seed=1) for p in ("full", "popularity", "uniform")]
    popularity = item_counts(known, v)
    ms = {}
    for name, fn in scorers.items():
        t0 = time.perf_counter()
        evaluate_all({name: fn}, data, protocols=protocols, vocab_size=v, max_history=50, popularity=popularity)
        ms[name] = 1000 * (time.perf_counter() - t0) / n
    return {"ms_per_user": ms, "fit_s": fit_s}


def test_phase(args: argparse.Namespace) -> None:
    """The job's test phase of a trained artifact, timed (see the module's docstring)."""
    import dataclasses

    import torch

    from models.kinds import MODEL_KINDS, build_recommender
    from training.config import read_raw
    from training.job import JobClock
    from training.jobs.recommend import RecommendJob
    from training.memory import reuse_freed_memory

    if args.threads:
        torch.set_num_threads(args.threads)
    raw = read_raw(Path(args.config), list(args.set))
    job = RecommendJob(RecommendJob.parse_config(raw), out_root=Path("/nonexistent"), data_path=args.data)
    if job.cfg.train.reuse_freed_memory:
        reuse_freed_memory()  # as the job does: without it, every large tensor is fresh pages
    t0 = time.perf_counter()
    job.prepare_data()
    loaded = time.perf_counter() - t0
    saved = torch.load(args.artifact / "model.pt", weights_only=True)
    known = {f.name for f in dataclasses.fields(MODEL_KINDS[saved["kind"]][0])}
    model = build_recommender(saved["kind"], {k: v for k, v in saved["config"].items() if k in known}).eval()
    model.load_state_dict(saved["state_dict"])
    job.max_history = model.max_history
    job.clock = JobClock(job.cfg.train.max_minutes * 60)  # the fits' share is the job's; no deadline bites
    t0 = time.perf_counter()
    _, names, got, _ = job.test(model)
    seconds = time.perf_counter() - t0
    report = {
        "loading_s": round(loaded, 1),
        "test_phase_s": round(seconds, 1),
        "fit_s": {n: round(job.costs.fit[n], 1) for n in names},
        "fitted_users": dict(job.costs.fitted_users),
        "scoring_s": round(got.seconds, 1),
        "users": got.users,
        "of": got.of,
        "ndcg10_full": {n: round(m["full"]["NDCG@10"], 4) for n, m in got.metrics.items() if "full" in m},
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=500_000)
    p.add_argument("--users", type=int, default=20_000, help="histories the baselines are fitted on")
    p.add_argument("--scored", type=int, default=2_000, help="users evaluated")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--artifact", type=Path, help="a trained recommender: time its job's test phase instead")
    p.add_argument("--config", type=Path, help="with --artifact: the config it was trained with")
    p.add_argument("--data", type=Path, help="with --artifact: the log it was trained on")
    p.add_argument("--set", action="append", default=[], help="with --artifact: config overrides, as --set")
    tree_arguments(p)
    args = p.parse_args()
    if args.artifact:
        if not args.config:
            p.error("--artifact needs --config")
        test_phase(args)
        return
    if args.one:
        print(json.dumps(one(args)))
        return
    trees = variants(args)
    runs: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        for name, tree in trees:
            flags = ["--items", str(args.items), "--users", str(args.users), "--scored", str(args.scored)]
            got = run_in_tree(__file__, name, tree, [*flags, "--threads", str(args.threads)])
            runs[name].append(got)
            print(
                f"round {r + 1} {name}: "
                + " | ".join(f"{s} {ms:.2f}" for s, ms in got["ms_per_user"].items())
                + " ms a user; fits "
                + " | ".join(f"{s} {sec:.1f}" for s, sec in got["fit_s"].items())
                + " s"
            )
    first = trees[0][0]

    def median(name: str, part: str, key: str) -> float:
        return statistics.median(x[part][key] for x in runs[name])

    report = {}
    for name, each in runs.items():
        report[name] = {
            part: {
                key: {
                    "median": round(median(name, part, key), 3),
                    "ratio": round(median(name, part, key) / median(first, part, key), 3),
                }
                for key in each[0][part]
            }
            for part in ("ms_per_user", "fit_s")
        }
        parts = [
            f"{s} {m['median']:.2f} ms ({m['ratio']:.2f}x {first})" for s, m in report[name]["ms_per_user"].items()
        ]
        parts += [f"fit {s} {m['median']:.1f} s ({m['ratio']:.2f}x)" for s, m in report[name]["fit_s"].items()]
        print(f"{name}: " + " | ".join(parts))
    if args.out:
        args.out.write_text(json.dumps({"report": report, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
