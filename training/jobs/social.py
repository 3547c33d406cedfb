"""The social-interaction job: a log of (actor, action, target, time) -> the chronological protocol ->
train -> evaluate beside the baselines -> artifact.

Protocol: events sorted by time; the last `test_share` of them (by count) are the test period, the
`valid_share` before them validation. The model picks its epoch on the validation queries having
trained on the training period only; `train.refit_epochs` then go on over everything before the test
period, so the test is ranked by a model that saw what happened before it (and nothing after).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from models import artifact
from models.activity import EventLog, as_tensors, recent_activity
from models.history_table import HistoryColumns
from models.ids import N_SPECIAL, UNK, IdMap
from models.kinds import build
from models.social import SocialBatch, SocialModel, incoming, time_buckets
from models.tasks.social import load_artifact
from models.warm import Remap, carry_over
from training.config import LoopConfig
from training.data.social import Periods, Timelines, load_social, period_queries, two_way
from training.job import Export, Job, warm_record
from training.jobs import DefaultRun, TaskJob, register_job
from training.jobs.social_eval import Baselines, QuerySet, evaluate_scorer, evaluate_scorers
from training.loop import History, train

log = logging.getLogger(__name__)
# The phases after the training loop (docs/decisions/job-budget.md): planned from what the model and the
# baselines cost a query, timed on COST_SAMPLE queries before training; at most MAX_AFTER_SHARE of the
# budget, the test then scoring its queries in a seeded order up to its deadline (a warm retrain's
# 30-second budget took 100-113 s when the test had none). A test planned under EVERY_QUERY_SHARE of the
# budget, or eval.every_query_s, scores every query whatever its deadline.
MAX_AFTER_SHARE = 0.3
VALID_SHARE = 0.1  # at most this share of the budget for each epoch's validation (a sample beyond it)
EVERY_QUERY_SHARE = 0.05
COST_SAMPLE = 256
TEST_MARGIN = 1.3  # the test's queries against the sample's: longer histories at the log's end
EXPORT_S = 2.0
EXPORT_BYTES_PER_EVENT_S = 16 / 50e6  # histories and the event log, at a slow disk's rate


@dataclass
class SocialData:
    path: str = ""  # CSV (optionally gzipped) or Parquet: src, dst, action, timestamp
    name: str = ""  # the data set's name (the store's namespace)
    drop_self_loops: bool = True
    valid_share: float = 0.1
    test_share: float = 0.1
    recent_examples: int = 0  # train on only the newest N examples (0 = all): a quick model
    # Histories also hold what others did to the user, as steps with the incoming action ("<-a2q" by
    # the asker whose question the user answered): who reached out is whom users answer next.
    incoming: bool = True


@dataclass
class SocialTrain(LoopConfig):
    refit_epochs: int = 1  # epochs over train + validation periods after the best epoch is chosen


@dataclass
class SocialEval:
    batch_size: int = 512
    recent_days: float = 7.0  # the recent-popularity baseline's window
    baselines: bool = True
    every_query_s: float = 2.0  # a test planned under this many seconds scores every query, deadline or not


# How [model] activity windows are given: seconds, or multiples of the training period's median gap
# between a user's consecutive events (the network's own clock; docs/decisions/recent-activity.md).
ACTIVITY_UNITS = ("second", "median_gap")


def median_gap(users: np.ndarray, times: np.ndarray) -> float:
    """The median time between a user's consecutive events (positive gaps only), over the given events."""
    frame = pd.DataFrame({"u": users, "t": times}).sort_values(["u", "t"], kind="stable")
    gaps = frame.groupby("u")["t"].diff().to_numpy()
    gaps = gaps[gaps > 0]
    if not len(gaps):
        raise ValueError("no user has two events at different times: activity windows need a time scale")
    return float(np.median(gaps))


class SocialJob(Job[SocialData, SocialTrain, SocialEval]):
    task = "social"
    data_config = SocialData
    train_config = SocialTrain
    eval_config = SocialEval
    key_metric = "NDCG@10"
    curve_keys = ("NDCG@10", "HR@10")

    def prepare_data(self) -> None:
        c = self.cfg.data
        path = self.data_file(c.path)
        self.log = lg = load_social(path, drop_self_loops=c.drop_self_loops)
        self.periods = p = Periods.of(len(lg), valid_share=c.valid_share, test_share=c.test_share)
        # The users seen before the test period: with the log's newest 10% in the map too, the shipped
        # config tested 0.4598 against 0.4657, new-target HR@10 0.3274 against 0.3535 (same seed,
        # docs/decisions/retrainer.md), so a user first seen in the test period stays unknown until a
        # later run's log has it earlier.
        before_test = pd.unique(np.concatenate([lg.src[: p.test], lg.dst[: p.test]]))
        self.users = IdMap(str(u) for u in before_test)
        own = [str(a) for a in pd.unique(lg.action[: p.test])]
        self.n_own_actions = len(own)  # indices N_SPECIAL .. N_SPECIAL + len(own) - 1: own actions first
        self.actions = IdMap(own + ([incoming(a) for a in own] if c.incoming else []))
        self.tgt = np.asarray(self.users.indices(list(lg.dst)), dtype=np.int64)
        self.src = np.asarray(self.users.indices(list(lg.src)), dtype=np.int64)
        self.act = np.asarray(self.actions.indices(list(lg.action)), dtype=np.int64)
        self.timelines = Timelines(lg.src, self.tgt, self.act, lg.time)  # what each actor did
        # Both directions: the contacts baseline always, the model's histories when `incoming`.
        self.contacts, self.contact_row = Timelines.both_directions(
            lg.src,
            lg.dst,
            src_index=self.src,
            dst_index=self.tgt,
            actions=self.act,
            incoming_actions=np.asarray(self.actions.indices([incoming(str(a)) for a in lg.action]), dtype=np.int64),
            times=lg.time,
        )
        if c.incoming:
            self.steps, self.step_row = self.contacts, self.contact_row
        else:
            self.steps, self.step_row = self.timelines, np.arange(len(lg))
        # Each user's first event (as actor or target): candidates of a period are those seen before it.
        first = np.full(len(self.users), len(lg), dtype=np.int64)
        order = np.arange(len(lg))
        np.minimum.at(first, self.src, order)
        np.minimum.at(first, self.tgt, order)
        first[:N_SPECIAL] = len(lg)
        self.first_event = first
        self.median_gap = median_gap(lg.src[: p.valid], lg.time[: p.valid])
        self.valid_q = self._queries(p.valid, p.test)
        self.val_q = self.valid_q  # what each epoch validates on: all, or a sample (_size_validation)
        self.test_q = self._queries(p.test, len(lg))
        log.info(
            "%s: %d events (%d self-loops, %d duplicates dropped), %d users before the test period, "
            "%d validation and %d test queries",
            lg.source,
            len(lg),
            lg.dropped_self_loops,
            lg.dropped_duplicates,
            self.users.n_entities,
            len(self.valid_q),
            len(self.test_q),
        )

    def _queries(self, start: int, end: int) -> QuerySet:
        q = period_queries(self.log, start, end)
        pool = torch.from_numpy(self.first_event < start)
        return QuerySet(
            q.event,
            torch.from_numpy(self.tgt[q.event]),
            torch.from_numpy(self.src[q.event]),
            torch.from_numpy(q.repeat),
            torch.from_numpy(self.log.time[q.event]),
            pool,
        )

    def build_model(self) -> SocialModel:
        model = build(
            self.cfg.kind,
            {
                **self.model_settings(),
                "n_users": len(self.users),
                "n_actions": len(self.actions),
                "n_own_actions": self.n_own_actions,
            },
        )
        assert isinstance(model, SocialModel)
        return model

    def warm_start(self, model: nn.Module) -> dict[str, Any]:
        """The served version's weights through both id maps: users (embeddings, biases) and actions."""
        assert self.warm_from is not None and isinstance(model, SocialModel)
        old = load_artifact(self.warm_from)
        if old.manifest.kind != self.cfg.kind:
            raise ValueError(f"{self.warm_from} is a {old.manifest.kind} model, not {self.cfg.kind}")
        state = old.model.state_dict()
        own_old = list(old.actions.raws())[: old.model.config.n_own_actions]
        own_new = list(self.actions.raws())[: self.n_own_actions]
        if own_old != own_new:
            # The activity input's weights are laid out by the log's own actions: another set or order
            # of them makes those weights mean other counts, so they start fresh.
            state = {k: v for k, v in state.items() if not k.startswith("activity")}
        got = carry_over(model, state, old.users, self.users, Remap(old.actions, self.actions))
        return warm_record(
            got, source=str(self.warm_from), parent=old.manifest, noun="users", old_ids=old.users, new_ids=self.users
        )

    def model_settings(self) -> dict[str, Any]:
        """The config's [model] with `activity_unit` resolved: windows given in median gaps become seconds
        (what the model and the artifact keep), so one config fits networks on any clock."""
        settings = dict(self.cfg.model)
        unit = settings.pop("activity_unit", "second")
        if unit not in ACTIVITY_UNITS:
            raise ValueError(f"model.activity_unit must be one of {ACTIVITY_UNITS}, got {unit!r}")
        if unit == "median_gap" and settings.get("activity"):
            windows = [float(w) * self.median_gap for w in settings["activity"]]
            log.info(
                "activity windows: %s x the median gap between a user's consecutive events (%.0f s) = %s s",
                settings["activity"],
                self.median_gap,
                [round(w) for w in windows],
            )
            settings["activity"] = windows
        return settings

    def batch(self, events: np.ndarray, model: SocialModel, *, with_next: bool = False) -> SocialBatch:
        c = model.config
        targets, actions, times = self.steps.window(self.step_row[events], c.max_history)
        query = torch.from_numpy(self.log.time[events])[:, None]
        ago = time_buckets(query - times, c.n_time_buckets).masked_fill(targets == 0, 0)
        b = SocialBatch(targets, actions, ago)
        if c.activity:
            found = recent_activity(
                self.log.time,
                made=self.src,
                received=self.tgt,
                query_times=self.log.time[events],
                windows=c.activity,
                contacts=targets[:, -c.activity_contacts :].numpy() if c.activity_contacts else None,
                actions=self.act if c.activity_per_action else None,
                n_actions=c.n_own_actions,
            )
            b.activity_index, b.activity_counts = as_tensors(found)
        if with_next:
            b.next_target = torch.from_numpy(self.tgt[events])
            b.next_action = torch.from_numpy(self.act[events])
        return b

    def examples(self, end: int) -> np.ndarray:
        """Training events before `end` whose actor has an earlier step (in the model's histories)."""
        events = np.arange(end)
        events = events[self.steps.earlier(self.step_row[events]) > 0]
        n = self.cfg.data.recent_examples
        return events[-n:] if n else events

    def train_batches(self, model: nn.Module) -> Callable[[torch.Generator], Sequence[SocialBatch]]:
        with self.untimed():
            self.query_seconds = self._query_costs(model)
        self._size_validation()
        return self._batches(model, self.examples(self.periods.valid))

    def _size_validation(self) -> None:
        """Each epoch's validation on a seeded sample of its queries (the same every epoch) when all of them
        would take more than VALID_SHARE of the budget: on MathOverflow they take 26 s, a warm retrain's
        whole budget is 30."""
        n, cost = len(self.valid_q), self.query_seconds["model"]
        if n * cost <= VALID_SHARE * self.clock.seconds:
            return
        keep = max(COST_SAMPLE, int(VALID_SHARE * self.clock.seconds / max(cost, 1e-9)))
        self.val_q = self.valid_q.shuffled(self.cfg.train.seed, keep)
        log.info("validation on %d of %d queries (a seeded sample, the same each epoch)", len(self.val_q), n)

    def _query_costs(self, model: nn.Module) -> dict[str, float]:
        """Seconds a query of the model and of every baseline together, each on up to COST_SAMPLE queries."""
        assert isinstance(model, SocialModel)
        seed = self.cfg.train.seed
        valid, test = self.valid_q.shuffled(seed, COST_SAMPLE), self.test_q.shuffled(seed, COST_SAMPLE)
        model.eval()
        t0 = time.monotonic()
        evaluate_scorers(valid, {"model": self._scorer(model, valid)}, batch_size=self.cfg.eval.batch_size)
        costs = {"model": (time.monotonic() - t0) / max(len(valid), 1)}
        model.train()
        t0 = time.monotonic()
        evaluate_scorers(test, self._baselines(test), batch_size=self.cfg.eval.batch_size)
        costs["baselines"] = (time.monotonic() - t0) / max(len(test), 1)
        return costs

    def after_reserve(self, model: nn.Module) -> float:
        """The phases after the loop at full size: its last validation, the test of the model and the
        baselines, the artifact; at most MAX_AFTER_SHARE of the budget (the test is then cut by
        its deadline, the refit gets what is left)."""
        c = self.query_seconds
        plan = {
            "last_validation": c["model"] * len(self.val_q),  # the loop's, after its deadline
            "test": (c["model"] + c["baselines"]) * len(self.test_q) * TEST_MARGIN,
            "export": EXPORT_S + EXPORT_BYTES_PER_EVENT_S * len(self.log),
        }
        self.planned = dict(plan)
        cap = MAX_AFTER_SHARE * self.clock.seconds
        scale = min(1.0, max(cap - plan["export"], 0.0) / max(sum(plan.values()) - plan["export"], 1e-9))
        self.plan = {k: v if k == "export" else v * scale for k, v in plan.items()}
        log.info("kept after training (s): %s", " | ".join(f"{k} {v:.1f}" for k, v in self.plan.items()))
        return min(sum(plan.values()), cap)

    def _test_deadline(self) -> float | None:
        """None (every query) when the whole test was planned under EVERY_QUERY_SHARE of the budget or
        eval.every_query_s; else when the test must end for the artifact to fit in the budget."""
        bound = max(EVERY_QUERY_SHARE * self.clock.seconds, self.cfg.eval.every_query_s)
        if self.planned.get("test", 0.0) <= bound:
            return None
        return time.monotonic() + self.clock.left() - self.plan.get("export", 0.0)

    def _baselines(self, q: QuerySet) -> dict[str, Callable[[slice], torch.Tensor]]:
        """The baselines' scorers of the queries `q` (each fitted on what precedes the test period)."""
        if not self.cfg.eval.baselines:
            return {}
        b = Baselines(
            self.timelines,
            torch.from_numpy(self.tgt),
            self.log.time,
            len(self.users),
            contacts=self.contacts,
            contact_row=self.contact_row,
        )
        return {
            "popularity": b.popularity(self.periods.test),
            "recent_popularity": b.recent_popularity(q, self.cfg.eval.recent_days),
            "most_recent": b.most_recent(q),
            "most_recent_contact": b.most_recent_contact(q),
            "most_frequent": b.most_frequent(q),
        }

    def _batches(self, model: nn.Module, events: np.ndarray) -> Callable[[torch.Generator], Sequence[SocialBatch]]:
        assert isinstance(model, SocialModel)
        bs = self.cfg.train.batch_size
        job, social = self, model

        class Epoch(Sequence[SocialBatch]):
            """An epoch's batches, built when drawn: a shuffled order, windows gathered per batch."""

            def __init__(self, order: np.ndarray) -> None:
                self.order = order

            def __len__(self) -> int:
                return (len(self.order) + bs - 1) // bs

            def __getitem__(self, i: Any) -> Any:
                if isinstance(i, slice):
                    return [self[j] for j in range(*i.indices(len(self)))]
                if not 0 <= i < len(self):
                    raise IndexError(i)  # ends iteration (Sequence.__iter__ stops on it)
                return job.batch(self.order[i * bs : (i + 1) * bs], social, with_next=True)

        def make(gen: torch.Generator) -> Epoch:
            return Epoch(events[torch.randperm(len(events), generator=gen).numpy()])

        return make

    def _scorer(self, model: SocialModel, queries: QuerySet) -> Callable[[slice], torch.Tensor]:
        def score(part: slice) -> torch.Tensor:
            with torch.inference_mode():
                return model.scores(self.batch(queries.events[part], model).to(self.device)).float().cpu()

        return score

    def validate(self, model: nn.Module) -> dict[str, float]:
        assert isinstance(model, SocialModel)
        return evaluate_scorer(self.val_q, self._scorer(model, self.val_q), batch_size=self.cfg.eval.batch_size)["all"]

    def after_training(self, model: nn.Module, history: History) -> None:
        t = self.cfg.train
        if not t.refit_epochs:
            return
        # Before the refit has seen the validation period: the loop's validation of the weights it kept (a
        # second pass over every validation query took 18 s of a warm retrain's 30).
        self.valid_before_refit = history.val[history.best_epoch - 1]
        # Inside the job's budget: what the loop left, less what the test and the artifact were planned.
        minutes = (self.clock.left() - self.plan["test"] - self.plan["export"]) / 60
        if minutes <= 0:
            log.info("no refit: the budget was spent")
            history.stopped += "; no refit: the budget was spent"
            return
        refit = dataclasses.replace(
            t, epochs=t.refit_epochs, patience=t.refit_epochs + 1, warmup_steps=0, max_minutes=minutes
        )
        log.info(
            "refit: %d epoch(s) over everything before the test period, within %.1f minutes", t.refit_epochs, minutes
        )
        more = train(
            model,
            self._batches(model, self.examples(self.periods.test)),
            refit,
            validate=None,
            dist=self.dist,
            device=self.device,
        )
        history.stopped += f"; then {len(more.epoch)} refit epoch(s) ({more.stopped})"

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        assert isinstance(model, SocialModel)
        bs = self.cfg.eval.batch_size
        p = self.periods
        metrics: dict[str, Any] = {
            "events": {
                "total": len(self.log),
                "train": p.valid,
                "valid": p.test - p.valid,
                "test": len(self.log) - p.test,
            },
            "queries": {
                "valid": len(self.valid_q),
                "valid_scored": len(self.val_q),  # each epoch's validation: all, or a sample (_size_validation)
                "test": len(self.test_q),
                "test_repeat_share": float(self.test_q.repeat.float().mean()) if len(self.test_q) else 0.0,
            },
            "valid_before_refit": getattr(self, "valid_before_refit", None),
        }
        # A seeded order: a test cut short by its deadline has scored a random sample, the same for all.
        q = self.test_q.shuffled(self.cfg.train.seed)
        got, scored = evaluate_scorers(
            q, {"model": self._scorer(model, q), **self._baselines(q)}, batch_size=bs, deadline=self._test_deadline()
        )
        metrics["queries"]["test_scored"] = scored
        metrics["test"] = got.pop("model")
        if got:
            metrics["baselines_test"] = got
        if scored < len(q):
            log.info("test: %d of %d queries (a seeded sample) within the budget", scored, len(q))
        m = metrics["test"]
        log.info(
            "test NDCG@10 %.4f (repeat %.4f, new %.4f), new HR@10 %.4f",
            m["all"].get("NDCG@10", 0.0),
            m["repeat"].get("NDCG@10", 0.0),
            m["new"].get("NDCG@10", 0.0),
            m["new"].get("HR@10", 0.0),
        )
        if "baselines_test" in metrics:
            log.info(
                "baselines NDCG@10: %s",
                {k: round(v["all"].get("NDCG@10", 0.0), 4) for k, v in metrics["baselines_test"].items()},
            )
        return metrics

    def export(self, model: nn.Module) -> Export:
        assert isinstance(model, SocialModel)
        lg = self.log
        # Every user's final history (the whole log: serving continues from its end), newest last,
        # in the order the model's windows have (with incoming steps when the model takes them).
        owner, other, acts, times = lg.src, lg.dst, lg.action, lg.time
        if self.cfg.data.incoming:
            owner, other, acts, times, _, _ = two_way(
                lg.src,
                lg.dst,
                actions=lg.action,
                times=lg.time,
                incoming_actions=np.array([incoming(str(a)) for a in lg.action]),
            )
        steps: dict[str, tuple[list[str], list[float | None], list[str]]] = {}
        for s, d, a, t in zip(owner, other, acts, times, strict=True):
            row = steps.setdefault(str(s), ([], [], []))
            row[0].append(str(d))
            row[1].append(float(t))
            row[2].append(str(a))
        histories = HistoryColumns(
            list(steps),
            [r[0] for r in steps.values()],
            [r[1] for r in steps.values()],
            self.users,
            actions=[r[2] for r in steps.values()],
            action_ids=self.actions,
        )
        first_time: dict[str, float] = {}
        for users in (lg.src, lg.dst):
            frame = pd.DataFrame({"u": users, "t": lg.time}).groupby("u")["t"].min()
            for u, t in frame.items():
                first_time[str(u)] = min(float(t), first_time.get(str(u), float("inf")))
        info = {
            "source": lg.source,
            "sha256": lg.sha256,
            "events": len(lg),
            "users": self.users.n_entities,
            "actions": self.actions.n_entities,
            "self_loops_dropped": lg.dropped_self_loops,
            "duplicates_dropped": lg.dropped_duplicates,
            "unknown_target_index": UNK,
        }
        files: dict[str, Any] = {}
        if model.config.activity:  # what serving counts recent activity from, until live events take over
            files[artifact.EVENTS] = EventLog(lg.time, made=self.src, received=self.tgt, actions=self.act)
        return Export(
            files={
                **files,
                artifact.USERS: self.users,
                artifact.ACTIONS: self.actions,
                artifact.HISTORIES: histories,
                artifact.USER_META: {"unit": "second", "first_activity": first_time},
            },
            data=info,
            namespace=self.cfg.data.name or self.cfg.name,
        )


register_job(
    TaskJob(
        SocialJob,
        defaults=(
            DefaultRun(
                "training/configs/social_mathoverflow.toml",
                "SEQSERVE_SOCIAL",
                (
                    "name='social-mathoverflow-quick'",
                    "data.recent_examples=50000",
                    "train.epochs=1",
                    "train.refit_epochs=0",
                    "eval.baselines=false",
                ),
                what="a quick social model on MathOverflow (about 2 minutes)",
            ),
        ),
    )
)
