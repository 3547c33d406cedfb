"""The next-item recommendation job (SASRec, BERT4Rec): log -> leave-one-out split -> train ->
evaluate beside the simple baselines -> artifact."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from models import artifact
from models.base import SequentialRecommender
from models.histories import IndexedHistories
from models.ids import N_SPECIAL, IdMap
from models.kinds import build_recommender
from models.tasks.recommend import RecArtifact, load_artifact
from models.warm import carry_over
from training.config import LoopConfig, read_raw
from training.data import Interactions, load_interactions, locate_ml100k
from training.evaluate import BASELINES, PROTOCOLS, Protocol, ScoreFn, draw_negatives, evaluate, item_counts
from training.job import Export, Job
from training.loop import History, train, window_batches
from training.preflight import preflight
from training.splits import EvalSet, Split, leave_one_out, pad_right, windows

log = logging.getLogger(__name__)
EVALSET_FIELDS = ("users", "histories", "targets", "interacted")


@dataclass
class RecData:
    path: str = ""  # file or folder; empty = the default MovieLens-100k lookup (data set "ml-100k")
    item_table: str = ""  # optional item table (item, release time) for CSV/Parquet logs
    name: str = ""  # the data set's name: the artifact's history namespace
    full_data: bool = False  # train on every interaction (production model), no held-out split


@dataclass
class RecTrain(LoopConfig):
    # After choosing the epoch on validation, train this many more epochs with the validation
    # items added (everything but the test item, as in the BERT4Rec paper's protocol).
    refit_epochs: int = 0
    # Batches of windows of similar length (little padding computed); False: shuffled batches, where
    # every user's steps weigh the same whatever the batch.
    length_buckets: bool = True


@dataclass
class RecEval:
    protocol: str = "full"  # validation each epoch: "full" ranking, or "popularity"/"uniform" sampled negatives
    n_negatives: int = 100
    exclude_seen: bool = True  # full ranking: remove the user's earlier items from the candidates
    val_users: int = 0  # validate each epoch on this many users (0 = all), for speed
    # Test (and end-of-training validation) metrics on a seeded sample of this many users when there
    # are more (0 = all): model and baselines alike; metrics.json states how many. The baselines are
    # still fitted on every user.
    test_users: int = 100_000
    batch_size: int = 512
    protocols: list[str] = field(default_factory=lambda: list(PROTOCOLS))  # test protocols
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))  # scored on test beside the model
    # A model with a transition table (model.transition_width): the prior's weights tried on validation
    # after training; the best NDCG@10 is kept (0 = no prior). Without a validation split (full_data),
    # the config's model.transition_weight stays.
    # The grid reaches 8: a model weaker than counting (BERT4Rec on Beauty) peaks at 5 on validation.
    transition_weights: list[float] = field(
        default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0]
    )

    def __post_init__(self) -> None:
        for p in [self.protocol, *self.protocols]:
            Protocol(p)  # raises on an unknown one
        if not self.transition_weights or min(self.transition_weights) < 0:
            raise ValueError("transition_weights must be a non-empty list of weights >= 0")
        unknown = set(self.baselines) - set(BASELINES)
        if unknown:
            raise ValueError(f"unknown baseline(s) {sorted(unknown)}; known: {sorted(BASELINES)}")

    def of(self, negatives: str, seed: int) -> Protocol:
        return Protocol(negatives, self.n_negatives, self.exclude_seen, self.batch_size, seed)


def index_data(data: Interactions) -> tuple[IdMap, IdMap, list[list[int]]]:
    items = IdMap(data.item_ids)  # in list order: the item at position p gets index N_SPECIAL + p
    users = IdMap(data.users)
    return items, users, data.sequences(offset=N_SPECIAL)


def short_sequences(split: Split) -> list[list[int]]:
    """Training sequences of the users too short to hold anything out (they are not in test)."""
    held = set(split.test.users)
    return [s for u, s in enumerate(split.train) if u not in held]


def subsample(data: EvalSet, n: int, seed: int) -> EvalSet:
    if not n or len(data.targets) <= n:
        return data
    g = torch.Generator().manual_seed(seed)
    keep = sorted(torch.randperm(len(data.targets), generator=g)[:n].tolist())
    return EvalSet(*[[getattr(data, f)[i] for i in keep] for f in EVALSET_FIELDS])


def item_fields(data: Interactions, items: IdMap) -> dict[str, dict[str, object]]:
    """The display fields kept for the catalog's items: the item table's, and the release time."""
    fields: dict[str, dict[str, object]] = {name: dict(values) for name, values in data.item_fields.items()}
    if data.release_unit == "year":
        fields["release_year"] = {i: int(y) for i, y in data.release.items()}
    elif data.release_unit:
        fields["released_at"] = dict(data.release)
    catalog = set(items.raws())
    kept = {name: {i: v for i, v in values.items() if i in catalog} for name, values in fields.items()}
    return {name: values for name, values in kept.items() if values}


class RecommendJob(Job[RecData, RecTrain, RecEval]):
    task = "recommend"
    data_config = RecData
    train_config = RecTrain
    eval_config = RecEval

    data: Interactions
    items: IdMap
    users: IdMap
    split: Split
    popularity: torch.Tensor  # counts over the whole log: the paper protocol's negative sampler
    windows: torch.Tensor
    max_history: int
    valid_baselines: dict[str, dict[str, float]] | None = None  # on the per-epoch validation users
    transition_weights_tried: dict[float, float] | None = None  # validation NDCG@10 of each prior weight
    _negatives: dict[tuple[int, str], tuple[EvalSet, list[torch.Tensor]]]  # sampled protocols' draws per set

    @classmethod
    def prepared(cls, config: Path, *, data: Path | None = None) -> RecommendJob:
        """A job of this config (on `data` when given) with its data loaded and split (ids, split,
        popularity), nothing trained."""
        job = cls(cls.parse_config(read_raw(config, [])), out_root=Path("artifacts"), data_path=data)
        job.prepare_data()
        return job

    def _data_path(self) -> Path:
        c = self.cfg.data
        given = self.data_path or (Path(c.path) if c.path else None)
        if c.name == "ml-100k" and (given is None or given.is_dir()):
            shared = (self.shared_data or Path("../shared/data")) / "ml-100k"
            return locate_ml100k(given, shared, Path("data") / "ml-100k")
        if given is None:
            raise ValueError("no data: pass --data or set data.path")
        return given

    def prepare_data(self) -> None:
        c = self.cfg.data
        item_table = Path(c.item_table) if c.item_table else None
        self.data = load_interactions(self._data_path(), item_table)
        if self.warm_from is not None:
            self._carry_item_meta(load_artifact(self.warm_from))
        self.items, self.users, sequences = index_data(self.data)
        self.split = leave_one_out(sequences, full_data=c.full_data)
        self.popularity = item_counts(sequences, len(self.items))
        self.val_set = subsample(self.split.valid, self.cfg.eval.val_users, self.cfg.train.seed)
        self._negatives = {}

    def _carry_item_meta(self, old: RecArtifact) -> None:
        """A log exported from the service has no item table: the release times and display fields of
        the items the served version knew come from it (items first seen live have none)."""
        d = self.data
        if d.release_unit is None and old.release_unit is not None:
            d.release, d.release_unit = dict(old.release), old.release_unit
        if not d.item_fields and old.fields:
            d.item_fields = {  # the table's text fields; release times come back through d.release
                name: {i: v for i, v in values.items() if isinstance(v, str | list)}
                for name, values in old.fields.items()
                if name not in ("release_year", "released_at")
            }

    def warm_start(self, model: nn.Module) -> dict[str, Any]:
        assert self.warm_from is not None
        old = load_artifact(self.warm_from)
        if old.manifest.kind != self.cfg.kind:
            raise ValueError(f"{self.warm_from} is a {old.manifest.kind} model, not {self.cfg.kind}")
        got = carry_over(model, old.model.state_dict(), old.items, self.items)
        log.info(
            "warm start from %s: %d tensors carried, %d items kept, %d new%s",
            self.warm_from,
            got.tensors,
            got.ids_kept,
            got.ids_new,
            f"; fresh: {', '.join(got.fresh)}" if got.fresh else "",
        )
        return {
            "from": f"{old.manifest.name}/{old.folder.name}",
            "items_kept": got.ids_kept,
            "items_new": got.ids_new,
            "fresh_tensors": got.fresh,
        }

    def build_model(self) -> SequentialRecommender:
        model = build_recommender(self.cfg.kind, {**self.cfg.model, "vocab_size": len(self.items)})
        self.max_history = model.max_history
        return model

    def _windows(self, model: SequentialRecommender, sequences: list[list[int]]) -> torch.Tensor:
        rows = windows(sequences, model.window_len, min_len=2)
        return torch.tensor(pad_right(rows, model.window_len), dtype=torch.long, device=self.device)

    def train_batches(self, model: nn.Module) -> Callable[[torch.Generator], Sequence[torch.Tensor]]:
        assert isinstance(model, SequentialRecommender)
        model.set_item_frequencies(item_counts(self.split.train, len(self.items)))
        self.windows = self._windows(model, self.split.train)
        log.info(
            "%s: %d users, %d items, %d interactions; %d training windows of <= %d; %d validation targets",
            self.data.source,
            self.users.n_entities,
            self.items.n_entities,
            self.data.n_interactions,
            len(self.windows),
            model.window_len,
            len(self.split.valid.targets),
        )
        if self.dist.is_main and self.val_set.targets:
            with self.untimed():
                self._validation_baselines()
        return window_batches(self.windows, self.cfg.train.batch_size, by_length=self.cfg.train.length_buckets)

    def _validation_baselines(self) -> None:
        """The baselines on the validation users each epoch is scored on (fitted on the training part),
        so every epoch's line can be read against the strongest simple competitor."""
        proto = self.cfg.eval.protocol
        self.valid_baselines = {
            name: self._evaluate(BASELINES[name](self.split.train, len(self.items)), self.val_set, proto, "cpu")
            for name in self.cfg.eval.baselines
        }
        log.info(
            "validation (%s, %d users) NDCG@10 of the baselines: %s",
            proto,
            len(self.val_set.targets),
            " | ".join(f"{n} {m['NDCG@10']:.4f}" for n, m in self.valid_baselines.items()),
        )

    def preflight(self, model: nn.Module) -> None:
        assert isinstance(model, SequentialRecommender)
        rows = windows(self.split.train, model.window_len, min_len=2)[: self.cfg.train.batch_size]
        batch = torch.tensor(pad_right(rows, model.window_len), dtype=torch.long, device=self.device)
        preflight(model, batch, len(self.items))

    def validates(self) -> bool:
        return bool(self.val_set.targets)

    def _evaluate(self, score: ScoreFn, data: EvalSet, negatives: str, device: torch.device | str) -> dict[str, float]:
        t = self.cfg
        protocol = t.eval.of(negatives, t.train.seed)
        drawn = None
        if negatives != "full" and data.targets:
            # One draw per split and protocol, shared by the model and every baseline.
            key = (id(data), negatives)
            cached = self._negatives.get(key)
            if cached is None or cached[0] is not data:  # the set is kept in the entry: its id stays its own
                cached = (
                    data,
                    draw_negatives(data, vocab_size=len(self.items), protocol=protocol, popularity=self.popularity),
                )
                self._negatives[key] = cached
            drawn = cached[1]
        return evaluate(
            score,
            data,
            vocab_size=len(self.items),
            max_history=self.max_history,
            protocol=protocol,
            popularity=self.popularity,
            negatives=drawn,
            device=device,
        )

    def validate(self, model: nn.Module) -> dict[str, float]:
        assert isinstance(model, SequentialRecommender)
        return self._evaluate(model.scores, self.val_set, self.cfg.eval.protocol, self.device)

    def _all_protocols(self, score: ScoreFn, data: EvalSet, device: torch.device | str) -> dict[str, dict[str, float]]:
        return {p: self._evaluate(score, data, p, device) for p in self.cfg.eval.protocols}

    def _choose_transition_weight(self, model: SequentialRecommender, valid: EvalSet) -> None:
        """Fill the model's transition table from the training part and keep the prior weight with the
        best validation NDCG@10 (docs/decisions/transition-prior.md)."""
        config = model.config
        model.set_transitions(self.split.train)
        tried: dict[float, float] = {}
        for weight in self.cfg.eval.transition_weights:
            config.transition_weight = weight
            tried[weight] = self._evaluate(model.scores, valid, self.cfg.eval.protocol, self.device)["NDCG@10"]
        config.transition_weight = max(tried, key=lambda w: (tried[w], -w))  # a tie goes to the smaller weight
        self.transition_weights_tried = tried
        log.info(
            "transition prior on validation (NDCG@10 by weight): %s; kept %g",
            " | ".join(f"{w:g} {v:.4f}" for w, v in tried.items()),
            config.transition_weight,
        )

    def after_training(self, model: nn.Module, history: History) -> None:
        assert isinstance(model, SequentialRecommender)
        self.valid_metrics: dict[str, Any] | None = None
        self.transition_weights_tried = None
        if self.cfg.data.full_data:
            model.set_transitions(self.split.train)  # everything; the config's weight stays
            return
        if self.dist.is_main:
            with self.untimed():  # measured before a refit has seen the validation items
                valid = subsample(self.split.valid, self.cfg.eval.test_users, self.cfg.train.seed)
                if getattr(model.config, "transition_width", 0):
                    self._choose_transition_weight(model, valid)
                self.valid_metrics = self._all_protocols(model.scores, valid, self.device)
        t = self.cfg.train
        if t.refit_epochs:
            # The validation target joins the training data; the test item stays held out.
            refit = self._windows(model, self.split.test.histories + short_sequences(self.split))
            refit_cfg = dataclasses.replace(t, epochs=t.refit_epochs, patience=t.refit_epochs + 1)
            log.info("refit: %d more epochs on %d windows with the validation items", t.refit_epochs, len(refit))
            more = train(
                model,
                window_batches(refit, t.batch_size, by_length=t.length_buckets),
                refit_cfg,
                validate=None,
                dist=self.dist,
                device=self.device,
            )
            history.stopped += f"; then {len(more.epoch)} refit epochs with the validation items"
        # Test time knows every interaction but the test items: so does the transition table.
        model.set_transitions(self.split.test.histories + short_sequences(self.split))

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        assert isinstance(model, SequentialRecommender)
        e = self.cfg.eval
        out: dict[str, Any] = {
            "protocol": {
                "split": "full_data" if self.cfg.data.full_data else "leave_one_out",
                "refit_epochs_with_validation_items": self.cfg.train.refit_epochs,
                "n_negatives": e.n_negatives,
                "exclude_seen_in_full_ranking": e.exclude_seen,
                "ties": "count against the target",
                "baselines_fitted_on": "every interaction but each user's test item",
            }
        }
        if self.cfg.data.full_data:
            return out
        test = subsample(self.split.test, e.test_users, self.cfg.train.seed)
        out["protocol"]["test_users"] = {
            "scored": len(test.targets),
            "of": len(self.split.test.targets),
            "seed": self.cfg.train.seed,
        }
        log.info(
            "test: %d of %d users (eval.test_users %d, seed %d)",
            len(test.targets),
            len(self.split.test.targets),
            e.test_users,
            self.cfg.train.seed,
        )
        out["valid"] = self.valid_metrics
        tried = self.transition_weights_tried
        if tried is not None:
            out["transition_prior_valid_ndcg10"] = {f"{w:g}": round(v, 4) for w, v in tried.items()}
        out["baselines_valid_per_epoch_users"] = self.valid_baselines
        out["test"] = self._all_protocols(model.scores, test, self.device)
        # What is known at test time: every interaction but the held-out test items (of every user,
        # sampled or not).
        known = self.split.test.histories + short_sequences(self.split)
        out["baselines_test"] = {
            name: self._all_protocols(BASELINES[name](known, len(self.items)), test, "cpu") for name in e.baselines
        }
        for proto, m in out["test"].items():
            rows = " | ".join(f"{n} {b[proto]['NDCG@10']:.4f}" for n, b in out["baselines_test"].items())
            log.info(
                "test (%s): HR@10 %.4f NDCG@10 %.4f MRR %.4f | baselines NDCG@10: %s",
                proto,
                m["HR@10"],
                m["NDCG@10"],
                m["MRR"],
                rows,
            )
        if "full" in out["test"] and out["baselines_test"]:
            best = max(out["baselines_test"].items(), key=lambda kv: kv[1]["full"]["NDCG@10"])
            ratio = out["test"]["full"]["NDCG@10"] / max(best[1]["full"]["NDCG@10"], 1e-12)
            out["full_ndcg10_vs_best_baseline"] = {"baseline": best[0], "ratio": round(ratio, 4)}
            log.info("full ranking NDCG@10: %.2fx the best baseline (%s)", ratio, best[0])
        return out

    def export(self, model: nn.Module) -> Export:
        d = self.data
        files = {
            artifact.ITEMS: self.items,
            artifact.ITEM_META: {"unit": d.release_unit, "release": d.release},
            # The table's keys are the users: no separate user map (the model has no user embedding).
            artifact.HISTORIES: IndexedHistories(
                d.users, d.ends, items=d.items.astype(np.int32) + N_SPECIAL, times=d.times
            ),
        }
        fields = item_fields(d, self.items)
        if fields:
            files[artifact.ITEM_FIELDS] = {"fields": fields}
        info = {
            "source": d.source,
            "sha256": d.sha256,
            "users": len(d.users),
            "items": self.items.n_entities,
            "interactions": d.n_interactions,
            "release_unit": d.release_unit,
        }
        return Export(files=files, data=info, namespace=self.cfg.data.name or self.cfg.name)


JOB = RecommendJob
