"""What would knowing who is being interacted with right now add to a trained social model?

    .venv/bin/python -m bench.training.social_activity --choose-on runs/soc_q/social-mathoverflow/<version> \
        --test runs/soc_ship/social-mathoverflow/<version>

The social job's own split, queries and evaluation (training/jobs/social.py, training/jobs/social_eval.py).
To the model's log-probabilities it adds c * log(1 + n) per candidate, n = the interactions the
candidate received (or made) in a window before the query, events strictly earlier only. The
coefficients are chosen greedily on the validation queries with the `--choose-on` model (one not
refit over the validation period), then the `--test` model scores the test queries with and without
them, beside its run's best baseline (metrics.json). The probe that chose the windows of the social
model's `activity` input, which learns its weights instead (docs/decisions/recent-activity.md).
"""

from __future__ import annotations

import argparse
import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.activity import recent_activity
from models.checkpoint import load_checkpoint
from models.social import SocialModel
from training.jobs.social import SocialJob
from training.jobs.social_eval import QuerySet, evaluate_scorer

HOUR = 3600.0
WINDOWS = (HOUR, 6 * HOUR, 24 * HOUR, 7 * 24 * HOUR)
WHO = ("received", "made")
GRID = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
Key = tuple[float, str]


class Activity:
    """Per query, log(1 + interactions each user received or made in (t - window, t)), t the query's time,
    counted by the model's own function (models/activity.py); kept sparse, summed into a (B, V) slice
    on demand."""

    def __init__(self, job: SocialJob, queries: QuerySet, *, window: float, who: str) -> None:
        t = job.log.time[queries.events]
        found = recent_activity(job.log.time, made=job.src, received=job.tgt, query_times=t, windows=[window])
        column = found.counts[:, WHO.index(who)]
        keep = column > 0
        self.rows, self.cols = found.rows[keep], found.users[keep]
        self.values = torch.from_numpy(np.log1p(column[keep]))
        self.starts = np.searchsorted(self.rows, np.arange(len(t) + 1))

    def add(self, scores: torch.Tensor, part: slice, c: float) -> torch.Tensor:
        a, b = self.starts[part.start], self.starts[part.stop]
        r = torch.from_numpy(self.rows[a:b] - part.start)
        return scores.index_put((r, torch.from_numpy(self.cols[a:b])), c * self.values[a:b], accumulate=True)


def model_scores(job: SocialJob, model: SocialModel, queries: QuerySet, part: slice) -> torch.Tensor:
    with torch.inference_mode():
        return model.scores(job.batch(queries.events[part], model)).float()


def evaluate(
    queries: QuerySet,
    base: Callable[[slice], torch.Tensor],
    coef: dict[Key, float],
    features: Callable[[Key], Activity],
) -> dict[str, dict[str, float]]:
    def score(part: slice) -> torch.Tensor:
        s = base(part)
        for key, c in coef.items():
            s = features(key).add(s, part, c)
        return s

    return evaluate_scorer(queries, score, batch_size=512)


def feature_cache(job: SocialJob, queries: QuerySet) -> Callable[[Key], Activity]:
    cache: dict[Key, Activity] = {}

    def get(key: Key) -> Activity:
        if key not in cache:
            cache[key] = Activity(job, queries, window=key[0], who=key[1])
        return cache[key]

    return get


def load(folder: Path) -> tuple[SocialModel, dict[str, Any]]:
    _, model = load_checkpoint(folder / "model.pt")
    assert isinstance(model, SocialModel), f"{folder} is not a social model"
    return model.eval(), json.loads((folder / "metrics.json").read_text())


def line(label: str, m: dict[str, dict[str, float]]) -> str:
    return (
        f"| {label} | {m['all']['NDCG@10']:.4f} | {m['all']['HR@10']:.4f} | {m['repeat']['NDCG@10']:.4f} "
        f"| {m['new']['NDCG@10']:.4f} | {m['new']['HR@10']:.4f} |"
    )


def choose(job: SocialJob, model: SocialModel) -> dict[Key, float]:
    """Greedy on the validation queries: the best single addition (window, who, coefficient), until none
    helps."""
    val = job.valid_q
    cached = torch.cat([model_scores(job, model, val, p) for p in val.batches(512)])

    def val_base(part: slice) -> torch.Tensor:
        return cached[part]

    features = feature_cache(job, val)
    coef: dict[Key, float] = {}
    best = evaluate(val, val_base, coef, features)["all"]["NDCG@10"]
    print(f"validation, model alone: {best:.4f}", flush=True)
    keys = [(w, who) for w in WINDOWS for who in WHO]
    while True:
        trial: tuple[float, Key, float] | None = None
        for key in keys:
            if key in coef:
                continue
            for c in GRID:
                v = evaluate(val, val_base, {**coef, key: c}, features)["all"]["NDCG@10"]
                if v > best and (trial is None or v > trial[0]):
                    trial = (v, key, c)
        if trial is None:
            return coef
        best, key, c = trial
        coef[key] = c
        print(f"validation, + {key[1]} in {key[0] / HOUR:g} h x {c:g}: {best:.4f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--choose-on", type=Path, required=True, help="artifact version: chooses on validation")
    ap.add_argument("--test", type=Path, help="artifact version scored on test (default: --choose-on)")
    ap.add_argument("--config", type=Path, default=Path("training/configs/social_mathoverflow.toml"))
    ap.add_argument("--data", type=Path, help="the log (default: the config's data.path)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    raw = tomllib.loads(args.config.read_text())
    if args.data:
        raw["data"]["path"] = str(args.data)
    job = SocialJob(SocialJob.parse_config(raw))
    job.prepare_data()
    coef = choose(job, load(args.choose_on)[0])

    tester, metrics = load(args.test or args.choose_on)
    test = job.test_q

    def test_base(part: slice) -> torch.Tensor:
        return model_scores(job, tester, test, part)

    print("| scorer | NDCG@10 | HR@10 | repeat NDCG@10 | new NDCG@10 | new HR@10 |")
    print("|---|---|---|---|---|---|")
    test_features = feature_cache(job, test)
    alone = evaluate(test, test_base, {}, test_features)
    added = evaluate(test, test_base, coef, test_features)
    print(line("model", alone))
    terms = ", ".join(f"{c:g} x {who} in {w / HOUR:g} h" for (w, who), c in coef.items())
    print(line(f"model + {terms or 'nothing'}", added))
    baselines = metrics.get("baselines_test", {})
    if baselines:
        name, b = max(baselines.items(), key=lambda kv: kv[1]["all"]["NDCG@10"])
        print(line(f"baseline: {name}", b))
        top = b["all"]["NDCG@10"]
        print(
            f"\nx {name}: model {alone['all']['NDCG@10'] / top:.3f}, "
            f"model + activity {added['all']['NDCG@10'] / top:.3f}"
        )


if __name__ == "__main__":
    main()
