"""Would a ranking-time blend with item transitions lift a trained model? (the whole-catalog quality
target, docs/BENCHMARKS.md section 6)

    .venv/bin/python bench/blend_transitions.py --config training/configs/sasrec_beauty.toml \
        --artifact runs/beauty_b64/sasrec-beauty-b64/<version>

score = log_softmax(model) + lam * log p(item | last item), where p is the transition count from the
history's last item smoothed toward popularity by `beta` pseudo-counts, fitted on what is known at
test time (as the transitions baseline is). Test users are split at random in two halves: lam and
beta are chosen on one and reported on the other, beside the model alone on the same half.
Full ranking, seen items removed, the evaluation code of every training run.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from models.ids import N_SPECIAL
from models.layers import last_valid_index
from models.tasks.recommend import load_artifact
from training.evaluate import Protocol, ScoreFn, _gather_rows, _Rows, _sparse_rows, evaluate, item_counts
from training.jobs.recommend import RecommendJob, short_sequences
from training.splits import EvalSet


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--artifact", type=Path, required=True, help="a version folder trained with that config")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    job = RecommendJob.prepared(args.config)
    art = load_artifact(args.artifact)
    if art.items.raws() != job.items.raws():
        raise SystemExit("the artifact was not trained on this config's data")
    model, n_items = art.model.eval(), len(job.items)
    test = job.split.test
    known = test.histories + short_sequences(job.split)
    a = torch.tensor([x for s in known for x in s[:-1]])
    b = torch.tensor([x for s in known for x in s[1:]])
    trans = _Rows.of(_sparse_rows(a, b, torch.ones(len(a)), n_items, n_items))
    pop = item_counts(known, n_items).float() + 1.0
    pop_p = pop / pop.sum()

    def blend(lam: float, beta: float) -> ScoreFn:
        def score(seq: torch.Tensor) -> torch.Tensor:
            m = model.scores(seq).float()
            m[:, :N_SPECIAL] = -1e9  # finite, so log_softmax stays finite; removed again below
            s = torch.log_softmax(m, 1)
            if lam:
                last = seq.gather(1, last_valid_index(seq)[:, None]).squeeze(1)
                c = _gather_rows(trans, last).float()
                s = s + lam * torch.log((c + beta * pop_p[None, :]) / (c.sum(1, keepdim=True) + beta))
            s[:, :N_SPECIAL] = -math.inf
            return s
        return score

    order = torch.randperm(len(test.targets), generator=torch.Generator().manual_seed(0)).tolist()

    def part(idx: list[int]) -> EvalSet:
        return EvalSet([test.users[i] for i in idx], [test.histories[i] for i in idx],
                       [test.targets[i] for i in idx], [test.interacted[i] for i in idx])

    half = len(order) // 2
    halves = {"A": part(order[:half]), "B": part(order[half:])}
    kw = {"vocab_size": n_items, "max_history": model.max_history, "protocol": Protocol("full")}
    grid = [(0.0, 1.0)] + [(lam, beta) for lam in (0.5, 1.0, 2.0, 4.0) for beta in (1.0, 20.0)]
    for choose, report in (("A", "B"), ("B", "A")):
        on = {g: evaluate(blend(*g), halves[choose], **kw)["NDCG@10"] for g in grid}  # type: ignore[arg-type]
        best = max(on, key=lambda g: on[g])
        got = evaluate(blend(*best), halves[report], **kw)["NDCG@10"]  # type: ignore[arg-type]
        alone = evaluate(blend(0.0, 1.0), halves[report], **kw)["NDCG@10"]  # type: ignore[arg-type]
        print(f"chosen on half {choose}: lam {best[0]}, beta {best[1]} (grid: "
              + ", ".join(f"{g[0]}/{g[1]} {v:.4f}" for g, v in on.items())
              + f"); half {report}: blend NDCG@10 {got:.4f}, model alone {alone:.4f}, {got / alone:.2f}x", flush=True)


if __name__ == "__main__":
    main()
