"""The next-location training job: staypoints -> MHSA protocol -> train -> evaluate -> artifact."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from models import artifact as A
from models.features import BUCKETING
from models.ids import PAD, UNK, IdMap
from models.mhsa import MHSA, StayBatch, collate_staypoints
from models.registry import build
from training.config import RunConfig
from training.data.staypoints import ProtocolSplit, Sample, build_protocol, load_staypoints, split_by_day
from training.distributed import Dist
from training.export import export_artifact
from training.locations_eval import (
    fit_transitions,
    location_metrics,
    markov_scores,
    most_frequent_scores,
    most_recent_scores,
)
from training.loop import length_buckets, seed_everything, train

log = logging.getLogger(__name__)


def novel_visits(split: ProtocolSplit, previous_days: int) -> set[tuple[str, str, int]]:
    """(user, location, sample day) triples where the place is new to the person as of the
    start of that sample's history window: first visited on or after target day - previous_days."""
    first: dict[tuple[str, str], int] = {}
    for s in split.train:
        for p in [*s.history, s.target]:
            key = (p.user, p.location)
            first[key] = min(first.get(key, p.day), p.day)
    out = set()
    for s in split.train:
        start = s.target.day - previous_days
        for p in [*s.history, s.target]:
            if first[(p.user, p.location)] >= start:
                out.add((p.user, p.location, s.target.day))
    return out


def to_batch(
    samples: list[Sample], locations: IdMap, users: IdMap, novel: set[tuple[str, str, int]] | None = None
) -> StayBatch:
    def loc(user: str, location: str, day: int) -> int:
        if novel is not None and (user, location, day) in novel:
            return UNK
        return locations.index(location)

    hist = [[(loc(p.user, p.location, s.target.day), p.start_min, p.weekday, p.duration) for p in s.history]
            for s in samples]
    targets = [loc(s.user, s.target.location, s.target.day) for s in samples]
    return collate_staypoints(hist, [users.index(s.user) for s in samples], targets)


def _scores(model: MHSA, batch: StayBatch, bs: int = 512) -> torch.Tensor:
    model.eval()
    with torch.inference_mode():
        return torch.cat([model.scores(batch.index(torch.arange(lo, min(lo + bs, len(batch)))))
                          for lo in range(0, len(batch), bs)])


def evaluate_split(scores: torch.Tensor, batch: StayBatch) -> dict[str, dict[str, float]]:
    """Metrics on all targets and on targets known from training (not the unknown class)."""
    assert batch.target is not None
    known = batch.target != UNK
    return {
        "all": location_metrics(scores, batch.target),
        "known": location_metrics(scores[known], batch.target[known]),
    }


def baselines(split: ProtocolSplit, data_points: Any, batch: StayBatch) -> dict[str, dict[str, dict[str, float]]]:
    vocab = len(split.locations)
    parts = split_by_day(data_points)
    transitions = fit_transitions([split.locations.indices([p.location for p in pts]) for pts in parts["train"]], vocab)
    last = batch.loc.gather(1, ((batch.loc != PAD).sum(1) - 1)[:, None]).squeeze(1)
    markov = markov_scores(transitions, last)
    # A last place never left in training: the chain knows nothing but "somewhere new".
    empty = torch.isinf(markov).all(1)
    markov[empty, UNK] = 0.0
    return {
        "most_recent": evaluate_split(most_recent_scores(batch.loc, vocab), batch),
        "most_frequent": evaluate_split(most_frequent_scores(batch.loc, vocab), batch),
        "markov": evaluate_split(markov, batch),
    }


def train_next_location(cfg: RunConfig, data_path: Path, out_root: Path, dist: Dist | None = None) -> Path | None:
    """Train, evaluate and export; returns the artifact folder (None on ranks other than 0)."""
    t = cfg.train
    dist = dist or Dist()
    if t.threads:
        torch.set_num_threads(t.threads)
    seed_everything(t.seed)
    data = load_staypoints(data_path)
    split = build_protocol(data, cfg.data.previous_days, cfg.data.min_history)
    log.info(
        "%s: %d / %d / %d samples, %d location classes, %d users",
        data.source, len(split.train), len(split.valid), len(split.test), len(split.locations), split.users.n_entities,
    )
    novel = novel_visits(split, cfg.data.previous_days) if t.novel_as_unknown else None
    train_b = to_batch(split.train, split.locations, split.users, novel)
    valid_b = to_batch(split.valid, split.locations, split.users)
    test_b = to_batch(split.test, split.locations, split.users)
    if novel is not None:
        assert train_b.target is not None
        log.info("novel places relabelled as unknown: %.1f%% of training targets",
                 100 * float((train_b.target == UNK).float().mean()))
    mcfg = {**cfg.model, "n_locations": len(split.locations), "n_users": len(split.users)}
    model = build(cfg.kind, mcfg)
    assert isinstance(model, MHSA)
    seed_everything(t.seed + dist.rank)  # same initial weights everywhere; each rank its own dropout
    lengths = (train_b.loc != PAD).sum(1)

    def batches(gen: torch.Generator) -> list[StayBatch]:
        return [train_b.index(idx) for idx in length_buckets(lengths, t.batch_size, gen)]

    def validate(m: MHSA) -> dict[str, float]:
        return evaluate_split(_scores(m, valid_b), valid_b)["all"]

    t0 = time.monotonic()
    history = train(model, batches, t, validate, key_metric="MRR", clip_grad_norm=t.clip_grad_norm or None,
                    dist=dist)
    if not dist.is_main:
        return None
    metrics: dict[str, Any] = {
        "train_seconds": round(time.monotonic() - t0, 1),
        "best_epoch": history.best_epoch,
        "epochs_run": len(history.epoch),
        "stopped": history.stopped,
        "samples": {"train": len(split.train), "valid": len(split.valid), "test": len(split.test)},
        "valid": evaluate_split(_scores(model, valid_b), valid_b),
        "test": evaluate_split(_scores(model, test_b), test_b),
        "baselines_test": baselines(split, data.points, test_b),
        "history": {"epoch": history.epoch, "loss": history.loss, "val": history.val},
    }
    m, b = metrics["test"]["all"], metrics["baselines_test"]["most_frequent"]["all"]
    log.info("test: Acc@1 %.4f Acc@5 %.4f MRR %.4f | most-frequent baseline Acc@1 %.4f MRR %.4f",
             m["Acc@1"], m["Acc@5"], m["MRR"], b["Acc@1"], b["MRR"])
    run_config = cfg.to_dict()
    run_config["model"] = mcfg
    info = {"source": data.source, "sha256": data.sha256, "staypoints": len(data.points),
            "locations": split.locations.n_entities, "users": split.users.n_entities}
    return export_artifact(
        out_root, cfg.name, cfg.kind, "next_location", model,
        {A.LOCATIONS: split.locations, A.USERS: split.users}, info, metrics, run_config, history,
        ("MRR", "Acc@1"), {"bucketing": BUCKETING},
    )

