"""The next-item recommendation job (SASRec, BERT4Rec): log -> leave-one-out split -> train ->
evaluate beside the simple baselines -> artifact."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models import artifact
from models.base import SequentialRecommender
from models.ids import N_SPECIAL, IdMap
from models.kinds import build_recommender
from models.ranking import pad_rows
from models.tasks.recommend import RecArtifact, load_artifact
from models.warm import carry_over
from training.config import LoopConfig, read_raw
from training.data import Columns, Interactions, Share, load_interactions, locate_ml100k, with_items
from training.history_shares import HistoryShares
from training.job import Export, Job, warm_record
from training.jobs import DefaultRun, TaskJob, register_job
from training.jobs.recommend_eval import (
    BASELINES,
    FIT_SECONDS,
    PROTOCOLS,
    Evaluated,
    Protocol,
    ScoreFn,
    evaluate_all,
    fit_baseline,
    item_counts,
    pooled,
    summed_pair_counts,
)
from training.jobs.similar_eval import SimilarItems
from training.loop import History, train, window_batches
from training.preflight import preflight
from training.splits import EvalSet, Split, leave_one_out, pad_right, windows

log = logging.getLogger(__name__)
EVALSET_FIELDS = ("users", "histories", "targets", "interacted")
# Shares of the budget (train.max_minutes, after loading; docs/decisions/job-budget.md): scoring the
# baselines on validation users before training, fitting them, a refit, writing the artifact, and at
# most what all the phases after the training loop may keep.
BASELINES_SHARE = 0.05
FIT_SHARE = 0.035  # fitting the baselines, each of the two times (on the training part, then for the test)
REFIT_SHARE = 0.1
# The prior's grid, past its top while validation still rises there: up to this many rounds of the
# three next weights up, each PRIOR_GRID_STEP times the one before.
PRIOR_GRID_ROUNDS = 3
PRIOR_GRID_STEP = 1.5
EXPORT_SHARE = 0.03  # at most: the plan keeps the artifact's bytes at EXPORT_BYTES_PER_S
MAX_AFTER_SHARE = 0.3
# Writing the artifact: its weights and the users' histories (EXPORT_HISTORY_BYTES an interaction, an
# upper bound); a slow disk's rate, so a plan errs on the side of the budget (docs/decisions/job-budget.md).
EXPORT_BYTES_PER_S = 50e6
EXPORT_HISTORY_BYTES = 16
# What 256 validation users scored before training miss of a test user: the model's transition prior
# (set after training) and a history one item longer; the margin covers both with little taken from the
# loop (docs/decisions/job-budget.md).
TEST_MARGIN = 1.3
# An evaluation planned (before training, at full size) under this share of the budget, or under
# eval.every_user_s, scores every user whatever its deadline: on a log as small as MovieLens-100k the
# whole phase costs about a second, and a figure on the half of the users a tight deadline let through
# is noise (the deadlines are for big logs).
EVERY_USER_SHARE = 0.05
# A model with a transition prior is also tested without it ("test_network_alone" in metrics.json).
NETWORK_ALONE = "network alone"


@dataclass
class Costs:
    """What the scorers cost, measured before training: seconds a baseline's fit, seconds a user."""

    fit: dict[str, float] = field(default_factory=dict)
    per_user: dict[str, float] = field(default_factory=dict)  # each baseline, and "model"
    test_user: float = 0.0  # the model and every baseline, under every test protocol
    fitted_users: dict[str, int] = field(default_factory=dict)  # the users the last fit of each took


@dataclass
class RecData:
    path: str = ""  # file or folder; empty = the default MovieLens-100k lookup (data set "ml-100k")
    item_table: str = ""  # optional item table (item, release time) for CSV/Parquet logs
    name: str = ""  # the data set's name: the artifact's history namespace
    full_data: bool = False  # train on every interaction (production model), no held-out split
    # A CSV or Parquet log as another engine named it: its user, item and time columns (empty: the
    # accepted names), an event-type column with the types to keep, what a numeric time counts ("s", "ms").
    user_column: str = ""
    item_column: str = ""
    time_column: str = ""
    event_column: str = ""
    events: list[str] = field(default_factory=list)
    time_unit: str = "s"
    # Under torchrun, each rank reads only its users' rows of a CSV or Parquet log (a hash of the user
    # id), trains on them and scores its own test users; the item map, counts, transition table and
    # test figures are combined over the ranks (docs/decisions/rank-shares.md). False: every rank reads
    # the whole log.
    share_by_user: bool = False

    def __post_init__(self) -> None:
        self.columns()  # an inconsistent mapping stops the config, not the load

    def columns(self) -> Columns:
        return Columns(
            self.user_column, self.item_column, self.time_column, self.event_column, tuple(self.events), self.time_unit
        )


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
    # An end-of-training evaluation planned (before training, at full size) under this many seconds or
    # EVERY_USER_SHARE of the budget scores every user of its sample whatever its deadline. The plan is
    # priced on the machine as it is: MovieLens-100k's test, about a second alone, was planned over 2 s on
    # this 2-core box beside the test suite's other jobs, and then cut to 512 of its 943 users.
    every_user_s: float = 5.0
    batch_size: int = 512
    protocols: list[str] = field(default_factory=lambda: list(PROTOCOLS))  # test protocols
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))  # scored on test beside the model
    # A model with a transition table (model.transition_width): the prior's weights tried on validation
    # after training; the best NDCG@10 is kept (0 = no prior). Without a validation split (full_data),
    # the config's model.transition_weight stays.
    # The grid reaches 8 (a model weaker than counting, BERT4Rec on Beauty, peaked at 5 on validation)
    # and goes on past its top while validation still rises there (PRIOR_GRID_ROUNDS).
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
    """A seeded sample of `n` targets (0 = all) in a seeded random order: an evaluation cut short by
    its deadline has scored a random sample of them."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.randperm(len(data.targets), generator=g)[: n or None].tolist()
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
    max_history: int
    valid_baselines: dict[str, dict[str, float]] | None = None  # on the per-epoch validation users
    valid_baselines_users: int = 0
    valid_baselines_fitted: dict[str, int] | None = None
    costs: Costs
    plan: dict[str, float]  # seconds kept for each phase after the training loop
    planned: dict[str, float]  # the same at full size, before the cap: EVERY_USER_SHARE reads it
    transition_weights_tried: dict[float, float] | None = None  # validation NDCG@10 of each prior weight

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
        share = Share(self.dist.rank, self.dist.world) if c.share_by_user and self.dist.enabled else None
        self.data = load_interactions(self._data_path(), item_table, c.columns(), share=share)
        if share is not None:
            # From here on each rank holds its own users: the loop, the counts and the test follow.
            self.dist = dataclasses.replace(self.dist, own_data=True)
            if self.dist.fewest(len(self.data.users)) == 0:  # all ranks stop here, none left waiting for another
                raise ValueError(f"a rank holds no user of {self.data.source}: fewer users than ranks")
            everyone = self.dist.gather_strings(self.data.item_ids, everywhere=True)
            with_items(self.data, sorted(set().union(*everyone)))  # one item map, the same on every rank
            digest = hashlib.sha256("\n".join(self.data.item_ids).encode()).hexdigest()[:16]
            log.info(
                "rank %d of %d holds %d users; item map of %d items, sha256 %s",
                self.dist.rank,
                self.dist.world,
                len(self.data.users),
                len(self.data.item_ids),
                digest,
            )
        if self.warm_from is not None:
            self._carry_item_meta(load_artifact(self.warm_from))
        self.items, self.users, sequences = index_data(self.data)
        self.split = leave_one_out(sequences, full_data=c.full_data)
        self.popularity = self.dist.total(item_counts(sequences, len(self.items)))
        self.val_set = subsample(self.split.valid, self.dist.share_of(self.cfg.eval.val_users), self.cfg.train.seed)
        self.costs, self.plan, self.planned = Costs(), {}, {}
        self.similar = SimilarItems(len(self.items), self.cfg.train.seed)

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
        return warm_record(
            got, source=str(self.warm_from), parent=old.manifest, noun="items", old_ids=old.items, new_ids=self.items
        )

    def build_model(self) -> SequentialRecommender:
        model = build_recommender(self.cfg.kind, {**self.cfg.model, "vocab_size": len(self.items)})
        self.max_history = model.max_history
        return model

    def _windows(self, model: SequentialRecommender, sequences: list[list[int]]) -> torch.Tensor:
        """Right-padded training windows (N, <= window_len), filled in one C array: padded Python lists
        of 2M windows took gigabytes more at the peak."""
        return pad_rows(windows(sequences, model.window_len, min_len=2)).to(self.device)

    def train_batches(self, model: nn.Module) -> Callable[[torch.Generator], Sequence[torch.Tensor]]:
        assert isinstance(model, SequentialRecommender)
        model.set_item_frequencies(self.dist.total(item_counts(self.split.train, len(self.items))))
        rows = self._windows(model, self.split.train)
        log.info(
            "%s: %d users, %d items, %d interactions; %d training windows of <= %d; %d validation targets",
            self.data.source,
            self.users.n_entities,
            self.items.n_entities,
            self.data.n_interactions,
            len(rows),
            model.window_len,
            len(self.split.valid.targets),
        )
        # Rank 0 validates; where each rank holds its own users, every rank validates its own with it.
        if self.validates() and (self.dist.is_main or self.dist.own_data):
            with self.untimed():
                self._validation_baselines(model)
        return window_batches(rows, self.cfg.train.batch_size, by_length=self.cfg.train.length_buckets)

    def _validation_baselines(self, model: SequentialRecommender) -> None:
        """The baselines on the validation users each epoch is scored on (fitted on the training part),
        so every epoch's line can be read against the strongest simple competitor; and what each
        scorer costs a user, from which the job sizes the phases after training."""
        proto = self.cfg.eval.protocol
        fitted = self._fit_baselines(self.split.train)
        self.valid_baselines_fitted = dict(self.costs.fitted_users)
        deadline = self.dist.main_deadline(time.monotonic() + BASELINES_SHARE * self.clock.seconds)
        mine = self._evaluate_all(fitted, self.val_set, [proto], deadline=deadline, device="cpu")
        got = pooled(mine, self.dist)
        if not self.dist.is_main:
            return
        for name in fitted:  # what one rank takes a user
            self.costs.per_user[name] = mine.seconds / max(mine.users, 1) / max(len(fitted), 1)
        self.valid_baselines = {name: m[proto] for name, m in got.metrics.items()}
        self.valid_baselines_users = got.users
        one = subsample(self.val_set, 256, self.cfg.train.seed)
        model.eval()
        self.costs.per_user["model"] = self._evaluate_all({"model": model.scores}, one, [proto]).seconds / len(
            one.targets
        )
        # The test scores every scorer under every protocol (priced in docs/decisions/job-budget.md).
        scorers = {"model": model.scores, **fitted}
        self.costs.test_user = self._evaluate_all(scorers, one, self.cfg.eval.protocols).seconds / len(one.targets)
        model.train()
        log.info(
            "validation (%s, %d of %d users) NDCG@10 of the baselines: %s; fitted in %s s",
            proto,
            got.users,
            got.of,
            " | ".join(f"{n} {m['NDCG@10']:.4f}" for n, m in self.valid_baselines.items()),
            " | ".join(f"{n} {v:.1f}" for n, v in self.costs.fit.items()),
        )

    def _fit_baselines(self, known: list[list[int]]) -> dict[str, ScoreFn]:
        """The configured baselines fitted on `known`, within FIT_SHARE of the budget together: one
        whose fit grows faster than the log and would take longer than its part is fitted on a seeded
        sample of the users (`fit_baseline`); the cheap ones go first. Where each rank holds its own
        users, every rank calls this at once: they fit each baseline together, from all their users."""
        fitted: dict[str, ScoreFn] = {}
        left = FIT_SHARE * self.clock.seconds
        names = sorted(self.cfg.eval.baselines, key=lambda name: name in FIT_SECONDS)
        for n, name in enumerate(names):
            t0 = time.monotonic()
            seconds = left / (len(names) - n)
            if self.dist.own_data:  # the ranks fit together: one sample, sized by rank 0's clock
                (seconds,) = self.dist.from_main(seconds)
            fitted[name], self.costs.fitted_users[name] = fit_baseline(
                name, known, len(self.items), seconds=seconds, seed=self.cfg.train.seed, dist=self.dist
            )
            self.costs.fit[name] = time.monotonic() - t0
            left = max(left - self.costs.fit[name], 0.0)
        return fitted

    def after_reserve(self, model: nn.Module) -> float:
        """The phases after the loop, from what each scorer cost a user before training: the loop's
        last validation, the prior's weights and the validation metrics, a refit, the model's transition
        table, the baselines fitted again and the test of every scorer, the artifact; at most
        MAX_AFTER_SHARE of the budget (the evaluations then score fewer users, by their deadlines)."""
        e, c = self.cfg.eval, self.costs
        model_user = c.per_user.get("model", 0.0)
        n_valid = min(e.test_users or len(self.split.valid.targets), len(self.split.valid.targets))
        n_test = min(e.test_users or len(self.split.test.targets), len(self.split.test.targets))
        plan = {
            "last_validation": model_user * len(self.val_set.targets),
            "valid": model_user * n_valid * 2.0,  # the prior's weights share the network's scores
            "refit": REFIT_SHARE * self.clock.seconds if self.cfg.train.refit_epochs else 0.0,
            # the model's transition table for the test, about what the transitions baseline's fit costs
            "transition_table": c.fit.get("transitions", 0.0) if getattr(model.config, "transition_width", 0) else 0.0,
            "test": min(sum(c.fit.values()), FIT_SHARE * self.clock.seconds) + n_test * c.test_user * TEST_MARGIN,
            "export": min(EXPORT_SHARE * self.clock.seconds, 2.0 + self._artifact_bytes(model) / EXPORT_BYTES_PER_S),
        }
        total = sum(plan.values())
        self.planned = plan  # each phase at full size: what decides whether an evaluation scores everyone
        cap = MAX_AFTER_SHARE * self.clock.seconds
        # Over the cap, the phases that can be cut (evaluations by their deadlines, the refit) give way;
        # writing the artifact takes what it takes.
        scale = min(1.0, max(cap - plan["export"], 0.0) / max(total - plan["export"], 1e-9))
        self.plan = {k: v if k == "export" else v * scale for k, v in plan.items()}
        log.info("kept after training (s): %s", " | ".join(f"{k} {v:.0f}" for k, v in self.plan.items()))
        return min(total, cap)

    def _artifact_bytes(self, model: nn.Module) -> float:
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        return weights + EXPORT_HISTORY_BYTES * self.data.n_interactions

    def _deadline(self, *after: str) -> float:
        """When a phase must end so that the planned phases `after` it still fit in the budget."""
        return time.monotonic() + self.clock.left() - sum(self.plan.get(k, 0.0) for k in after)

    def _evaluation_deadline(self, phase: str, *after: str) -> float | None:
        """An evaluation phase's deadline (`_deadline(*after)`); none, so that every user is scored, when
        the whole phase was planned under EVERY_USER_SHARE of the budget or eval.every_user_s."""
        bound = max(EVERY_USER_SHARE * self.clock.seconds, self.cfg.eval.every_user_s)
        if self.planned.get(phase, math.inf) <= bound:
            return None
        return self._deadline(*after)

    def preflight(self, model: nn.Module) -> None:
        assert isinstance(model, SequentialRecommender)
        rows = windows(self.split.train, model.window_len, min_len=2)[: self.cfg.train.batch_size]
        batch = torch.tensor(pad_right(rows, model.window_len), dtype=torch.long, device=self.device)
        preflight(model, batch, len(self.items))

    def validates(self) -> bool:
        return self.dist.counted(len(self.val_set.targets))[0] > 0

    def _evaluate_all(
        self,
        scorers: dict[str, ScoreFn],
        data: EvalSet,
        negatives: list[str],
        *,
        deadline: float | None = None,
        device: torch.device | str | None = None,
    ) -> Evaluated:
        e, seed = self.cfg.eval, self.cfg.train.seed
        return evaluate_all(
            scorers,
            data,
            protocols=[e.of(n, seed) for n in negatives],
            vocab_size=len(self.items),
            max_history=self.max_history,
            popularity=self.popularity,
            deadline=deadline,
            device=self.device if device is None else device,
        )

    def validate(self, model: nn.Module) -> dict[str, float]:
        assert isinstance(model, SequentialRecommender)
        proto = self.cfg.eval.protocol
        got = pooled(self._evaluate_all({"model": model.scores}, self.val_set, [proto]), self.dist)
        return got.metrics["model"][proto] if self.dist.is_main else {}  # the others' users are in rank 0's

    @staticmethod
    def _prior_scorers(model: SequentialRecommender, weights: list[float]) -> dict[str, ScoreFn]:
        """One scorer per prior weight (named by it), the network's scores computed once per batch."""
        memo: dict[str, torch.Tensor] = {}
        config = model.config

        def parts(seq: torch.Tensor) -> dict[str, torch.Tensor]:
            if memo.get("seq") is not seq:
                kept = config.transition_weight
                config.transition_weight = 0.0
                memo.update(seq=seq, net=model.scores(seq))
                config.transition_weight = 1.0
                memo["items"], memo["log_counts"] = model.prior_entries(seq)
                config.transition_weight = kept
            return memo

        def scorer(weight: float) -> ScoreFn:
            def score(seq: torch.Tensor) -> torch.Tensor:
                p = parts(seq)
                return p["net"].scatter_add(1, p["items"], weight * p["log_counts"]) if weight else p["net"]

            return score

        return {f"{w:g}": scorer(w) for w in weights}

    def _validation_metrics(self, model: SequentialRecommender, valid: EvalSet) -> Evaluated:
        """Every test protocol on validation users before any refit; with a transition table, every
        prior weight too, and the one with the best NDCG@10 under `eval.protocol` is kept (ties to the
        smaller; docs/decisions/transition-prior.md)."""
        e = self.cfg.eval
        protocols = list(dict.fromkeys([e.protocol, *e.protocols]))
        after = ("refit", "transition_table", "test", "export")
        deadline = self.dist.main_deadline(self._evaluation_deadline("valid", *after))

        def scored(scorers: dict[str, ScoreFn]) -> Evaluated:
            return pooled(self._evaluate_all(scorers, valid, protocols, deadline=deadline), self.dist)

        if not getattr(model.config, "transition_width", 0):
            return scored({"model": model.scores})
        got = scored(self._prior_scorers(model, e.transition_weights))
        # Where each rank scores its own users, the figures are rank 0's pooled ones: it decides, and
        # every rank follows (`Dist.agreed`).
        tried = {w: got.metrics[f"{w:g}"][e.protocol]["NDCG@10"] for w in e.transition_weights}
        chosen = max(tried, key=lambda w: (tried[w], -w))
        (n_valid,) = self.dist.counted(len(valid.targets))
        # The grid follows validation past its top: while the best weight is the largest tried, the next
        # weights up are scored on the same users (docs/decisions/transition-prior.md).
        for _ in range(PRIOR_GRID_ROUNDS):
            go, chosen = self.dist.agreed(float(chosen == max(tried) and chosen > 0 and got.users >= n_valid), chosen)
            if not go:
                break
            more = [float(f"{chosen * PRIOR_GRID_STEP**k:.3g}") for k in (1, 2, 3)]
            ext = scored(self._prior_scorers(model, more))
            # cut by the deadline: not the same users, not comparable
            if not self.dist.agreed(float(ext.users >= got.users))[0]:
                break
            got.metrics.update(ext.metrics)
            tried.update({w: ext.metrics[f"{w:g}"][e.protocol]["NDCG@10"] for w in more})
            chosen = max(tried, key=lambda w: (tried[w], -w))
        (chosen,) = self.dist.agreed(chosen)  # every rank's figures below are those of rank 0's weight
        model.config.transition_weight = chosen
        self.transition_weights_tried = tried
        if self.dist.is_main:
            log.info(
                "transition prior on validation (NDCG@10 by weight): %s; kept %g",
                " | ".join(f"{w:g} {v:.4f}" for w, v in tried.items()),
                chosen,
            )
        got.metrics = {"model": got.metrics[f"{chosen:g}"]}
        return got

    def after_training(self, model: nn.Module, history: History) -> None:
        assert isinstance(model, SequentialRecommender)
        self.valid_metrics: dict[str, Any] | None = None
        self.valid_users: dict[str, int] | None = None
        self.transition_weights_tried = None
        if self.cfg.data.full_data:
            self._set_transitions(model, self.split.train)  # everything; the config's weight stays
            return
        self._set_transitions(model, self.split.train)  # what validation knows
        if self.dist.is_main or self.dist.own_data:  # where each rank holds its own users, each scores them
            with self.untimed():  # measured before a refit has seen the validation items
                valid = subsample(self.split.valid, self.dist.share_of(self.cfg.eval.test_users), self.cfg.train.seed)
                got = self._validation_metrics(model, valid)
                self.valid_metrics = {p: m for p, m in got.metrics["model"].items() if p in self.cfg.eval.protocols}
                self.valid_users = {"scored": got.users, "of": self.dist.counted(len(self.split.valid.targets))[0]}
                if self.dist.is_main:
                    log.info("validation: %d of %d users in %.1f s", got.users, got.of, got.seconds)
                if not self.dist.own_data:  # one process holding every user: its neighbours are the whole log's
                    self.similar.validate(model, self.split.train, self.split.valid)
        t = self.cfg.train
        # Every rank takes rank 0's time left: they refit, or do not, together.
        (left,) = self.dist.from_main(self._deadline("transition_table", "test", "export") - time.monotonic())
        minutes = left / 60
        if t.refit_epochs and minutes * 60 >= REFIT_SHARE / 2 * self.clock.seconds:
            # The validation target joins the training data; the test item stays held out.
            refit = self._windows(model, self.split.test.histories + short_sequences(self.split))
            minutes = (
                self._deadline("transition_table", "test", "export") - time.monotonic()
            ) / 60  # less the windows'
            refit_cfg = dataclasses.replace(t, epochs=t.refit_epochs, patience=t.refit_epochs + 1, max_minutes=minutes)
            log.info(
                "refit: %d more epochs on %d windows with the validation items, within %.1f minutes",
                t.refit_epochs,
                len(refit),
                minutes,
            )
            more = train(
                model,
                window_batches(refit, t.batch_size, by_length=t.length_buckets),
                refit_cfg,
                validate=None,
                dist=self.dist,
                device=self.device,
            )
            history.stopped += f"; then {len(more.epoch)} refit epochs with the validation items ({more.stopped})"
        elif t.refit_epochs:
            history.stopped += "; no refit: too little of the budget was left"
        # Test time knows every interaction but the test items: so does the transition table.
        self._set_transitions(model, self.split.test.histories + short_sequences(self.split))

    def _set_transitions(self, model: SequentialRecommender, sequences: list[list[int]]) -> None:
        """The model's transition table from `sequences`; from every rank's, added up, where each rank
        holds its own users (every rank gets every rank's pair counts: the table's rows are the
        catalog's, not a user's)."""
        if not getattr(model.config, "transition_width", 0):
            return
        if not self.dist.own_data:
            model.set_transitions(sequences)
            return
        model.set_transition_counts(*summed_pair_counts(sequences, len(self.items), self.dist))

    def test(self, model: SequentialRecommender) -> tuple[EvalSet, list[str], Evaluated, int]:
        """The test phase: the baselines fitted on everything but the test items, then the model and
        each of them under every protocol on a seeded sample of the test users, until the phase's
        deadline. -> (the sample, the baselines' names, what was scored, the users they knew)."""
        e = self.cfg.eval
        test = subsample(self.split.test, self.dist.share_of(e.test_users), self.cfg.train.seed)
        # What is known at test time: every interaction but the held-out test items (of every user,
        # sampled or not).
        known = self.split.test.histories + short_sequences(self.split)
        fitted = self._fit_baselines(known)
        scorers: dict[str, ScoreFn] = {"model": model.scores}
        if model.uses_prior:  # the network alone beside it, from the same scores: what the prior adds
            weight = model.config.transition_weight
            both = self._prior_scorers(model, [weight, 0.0])
            scorers = {"model": both[f"{weight:g}"], NETWORK_ALONE: both["0"]}
        deadline = self.dist.main_deadline(self._evaluation_deadline("test", "export"))
        got = self._evaluate_all({**scorers, **fitted}, test, e.protocols, deadline=deadline)
        return test, list(fitted), got, len(known)

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
        if self.dist.own_data:
            out["protocol"]["users_split_over_ranks"] = self.dist.world
            out["protocol"]["baselines_fitted_on"] += ", every rank's users (each rank fits its own, counts summed)"
            out["protocol"]["valid_on"] = "every rank's users, each rank scoring its own"
        if self.cfg.data.full_data:
            return out
        test, fitted, got, known_users = self.test(model)
        got = pooled(got, self.dist)
        n_test, n_sample, known_users, n_train = self.dist.counted(
            len(self.split.test.targets), len(test.targets), known_users, len(self.split.train)
        )
        if not self.dist.is_main:  # its users are in rank 0's figures
            return out
        out["protocol"]["test_users"] = {
            "scored": got.users,
            "of": n_test,
            "sample": n_sample,  # eval.test_users, or all; the deadline may stop before its end
            "seed": self.cfg.train.seed,
        }
        log.info(
            "test: %d of %d users (a seeded sample of %d, seed %d) in %.1f s",
            got.users,
            n_test,
            n_sample,
            self.cfg.train.seed,
            got.seconds,
        )
        out["valid"] = self.valid_metrics
        out["protocol"]["valid_users"] = self.valid_users
        tried = self.transition_weights_tried
        if tried is not None:
            out["transition_prior_valid_ndcg10"] = {f"{w:g}": round(v, 4) for w, v in tried.items()}
        out["baselines_valid_per_epoch_users"] = self.valid_baselines
        out["protocol"]["baselines_valid_users"] = self.valid_baselines_users
        out["test"] = got.metrics["model"]
        if not self.dist.own_data:
            known = self.split.test.histories + short_sequences(self.split)
            out["similar_items"] = self.similar.metrics(model, known, self.split.test)
        if NETWORK_ALONE in got.metrics:
            out["test_network_alone"] = got.metrics[NETWORK_ALONE]
        out["baselines_test"] = {name: got.metrics[name] for name in fitted}
        out["protocol"]["baselines_fitted_users"] = {
            "valid": self.valid_baselines_fitted,
            "test": dict(self.costs.fitted_users),
            "of": {"valid": n_train, "test": known_users},
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
        for proto, m in out.get("test_network_alone", {}).items():
            log.info("test (%s) without the transition prior: NDCG@10 %.4f", proto, m["NDCG@10"])
        if "full" in out["test"] and out["baselines_test"]:
            best = max(out["baselines_test"].items(), key=lambda kv: kv[1]["full"]["NDCG@10"])
            ratio = out["test"]["full"]["NDCG@10"] / max(best[1]["full"]["NDCG@10"], 1e-12)
            out["full_ndcg10_vs_best_baseline"] = {"baseline": best[0], "ratio": round(ratio, 4)}
            log.info("full ranking NDCG@10: %.2fx the best baseline (%s)", ratio, best[0])
        return out

    def export(self, model: nn.Module) -> Export:
        """The artifact's files; where each rank holds its own users, rank 0's table holds every rank's,
        sent in rounds while rank 0 writes it (the other ranks send theirs here)."""
        d = self.data
        histories = HistoryShares(d.users, d.ends, items=d.items, times=d.times, item_offset=N_SPECIAL, dist=self.dist)
        n_users, n_interactions = self.dist.counted(len(d.users), d.n_interactions)
        if not self.dist.is_main:
            histories.send()
            return Export(files={}, data={})
        files = {
            artifact.ITEMS: self.items,
            artifact.ITEM_META: {"unit": d.release_unit, "release": d.release},
            # The table's keys are the users: no separate user map (the model has no user embedding).
            artifact.HISTORIES: histories,
        }
        fields = item_fields(d, self.items)
        if fields:
            files[artifact.ITEM_FIELDS] = {"fields": fields}
        if not self.dist.own_data and not self.cfg.data.full_data:
            files.update(self.similar.files(self.split.test.interacted + short_sequences(self.split)))
        info = {
            "source": d.source,
            "sha256": d.sha256,
            "users": n_users,
            "items": self.items.n_entities,
            "interactions": n_interactions,
            "release_unit": d.release_unit,
        }
        return Export(files=files, data=info, namespace=self.cfg.data.name or self.cfg.name)


register_job(
    TaskJob(
        RecommendJob,
        defaults=(
            DefaultRun(
                "training/configs/sasrec_ml100k.toml", "SEQSERVE_DATA", what="the default SASRec on MovieLens-100k"
            ),
        ),
    )
)
