"""The next-location job: staypoints -> MHSA protocol -> train -> evaluate beside the baselines -> artifact."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from models import artifact
from models.features import BUCKETING
from models.ids import PAD, UNK, IdMap
from models.kinds import build
from models.mhsa import MHSA
from models.staypoints import StayBatch, collate_staypoints
from training.config import Empty, LoopConfig
from training.data.staypoints import ProtocolSplit, Sample, build_protocol, load_staypoints, split_by_day
from training.job import Export, Job
from training.jobs import DefaultRun, TaskJob, register_job
from training.jobs.next_location_eval import (
    fit_transitions,
    location_metrics,
    markov_scores,
    most_frequent_scores,
    most_recent_scores,
)
from training.loop import length_buckets

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

    hist = [
        [(loc(p.user, p.location, s.target.day), p.start_min, p.weekday, p.duration) for p in s.history]
        for s in samples
    ]
    targets = [loc(s.user, s.target.location, s.target.day) for s in samples]
    return collate_staypoints(hist, [users.index(s.user) for s in samples], targets)


def _scores(model: MHSA, batch: StayBatch, device: torch.device, bs: int = 512) -> torch.Tensor:
    model.eval()
    with torch.inference_mode():
        return torch.cat(
            [
                model.scores(batch.index(torch.arange(lo, min(lo + bs, len(batch)))).to(device)).cpu()
                for lo in range(0, len(batch), bs)
            ]
        )


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


@dataclass
class LocData:
    path: str = ""  # staypoint CSV or Parquet
    name: str = ""  # the data set's name
    previous_days: int = 7  # history window in days
    min_history: int = 3  # fewest history staypoints of a sample


@dataclass
class LocTrain(LoopConfig):
    # Train on "a place the person had not visited before this history window" as the unknown class,
    # the way unseen places look at serving time.
    novel_as_unknown: bool = False


class NextLocationJob(Job[LocData, LocTrain, Empty]):
    task = "next_location"
    data_config = LocData
    train_config = LocTrain
    eval_config = Empty
    key_metric = "MRR"
    curve_keys = ("MRR", "Acc@1")

    def prepare_data(self) -> None:
        c = self.cfg.data
        path = self.data_file(c.path)
        self.data = load_staypoints(path)
        self.split = split = build_protocol(self.data, c.previous_days, c.min_history)
        log.info(
            "%s: %d / %d / %d samples, %d location classes, %d users",
            self.data.source,
            len(split.train),
            len(split.valid),
            len(split.test),
            len(split.locations),
            split.users.n_entities,
        )
        novel = novel_visits(split, c.previous_days) if self.cfg.train.novel_as_unknown else None
        self.train_b = to_batch(split.train, split.locations, split.users, novel)
        self.valid_b = to_batch(split.valid, split.locations, split.users)
        self.test_b = to_batch(split.test, split.locations, split.users)
        if novel is not None:
            assert self.train_b.target is not None
            log.info(
                "novel places relabelled as unknown: %.1f%% of training targets",
                100 * float((self.train_b.target == UNK).float().mean()),
            )

    def build_model(self) -> MHSA:
        model = build(
            self.cfg.kind,
            {**self.cfg.model, "n_locations": len(self.split.locations), "n_users": len(self.split.users)},
        )
        assert isinstance(model, MHSA)
        return model

    def train_batches(self, model: nn.Module) -> Callable[[torch.Generator], Sequence[StayBatch]]:
        lengths = (self.train_b.loc != PAD).sum(1)
        bs = self.cfg.train.batch_size

        def batches(gen: torch.Generator) -> list[StayBatch]:
            return [self.train_b.index(idx) for idx in length_buckets(lengths, bs, gen)]

        return batches

    def validate(self, model: nn.Module) -> dict[str, float]:
        assert isinstance(model, MHSA)
        return evaluate_split(_scores(model, self.valid_b, self.device), self.valid_b)["all"]

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        assert isinstance(model, MHSA)
        split = self.split
        metrics: dict[str, Any] = {
            "samples": {"train": len(split.train), "valid": len(split.valid), "test": len(split.test)},
            "valid": evaluate_split(_scores(model, self.valid_b, self.device), self.valid_b),
            "test": evaluate_split(_scores(model, self.test_b, self.device), self.test_b),
            "baselines_test": baselines(split, self.data.points, self.test_b),
        }
        m, b = metrics["test"]["all"], metrics["baselines_test"]["most_frequent"]["all"]
        log.info(
            "test: Acc@1 %.4f Acc@5 %.4f MRR %.4f | most-frequent baseline Acc@1 %.4f MRR %.4f",
            m["Acc@1"],
            m["Acc@5"],
            m["MRR"],
            b["Acc@1"],
            b["MRR"],
        )
        return metrics

    def export(self, model: nn.Module) -> Export:
        split, data = self.split, self.data
        info = {
            "source": data.source,
            "sha256": data.sha256,
            "staypoints": len(data.points),
            "locations": split.locations.n_entities,
            "users": split.users.n_entities,
        }
        return Export(
            files={artifact.LOCATIONS: split.locations, artifact.USERS: split.users},
            data=info,
            namespace=self.cfg.data.name or self.cfg.name,
            extra={"bucketing": BUCKETING},
        )


register_job(
    TaskJob(
        NextLocationJob,
        defaults=(
            DefaultRun(
                "training/configs/mhsa_geolife.toml",
                "SEQSERVE_GEOLIFE",
                ("train.max_minutes=1.0",),
                what="a quick next-location model on GeoLife (1-minute budget)",
            ),
        ),
    )
)
