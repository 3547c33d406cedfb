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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from models import artifact
from models.activity import EventLog, as_tensors, recent_activity
from models.histories import HistoryColumns
from models.ids import N_SPECIAL, UNK, IdMap
from models.kinds import build
from models.social import SocialBatch, SocialModel, incoming, time_buckets
from models.tasks.social import load_artifact
from models.warm import FIRST_SEEN_LIVE, Remap, added_live, carry_over
from training.config import LoopConfig
from training.data.social import Periods, Timelines, load_social, period_queries, two_way
from training.job import AFTER_SHARE, Export, Job
from training.loop import History, train
from training.social_eval import Baselines, QuerySet, evaluate_scorer

log = logging.getLogger(__name__)


@dataclass
class SocialData:
    path: str = ""  # CSV (optionally gzipped) or Parquet: src, dst, action, timestamp
    name: str = ""  # the data set's name (the history store's namespace)
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
        # Every user of the log, those first seen in the test period too (last): serving continues from
        # the log's end, where they are candidates; the test's queries and candidates are only users
        # seen before its period (`first_event` below), so the figures do not change with them.
        before_test = pd.unique(np.concatenate([lg.src[: p.test], lg.dst[: p.test]]))
        self.users = IdMap(str(u) for u in pd.unique(np.concatenate([before_test, lg.src[p.test :], lg.dst[p.test :]])))
        self.n_before_test = len(before_test)
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
        self.test_q = self._queries(p.test, len(lg))
        log.info(
            "%s: %d events (%d self-loops, %d duplicates dropped), %d users (%d before the test period), "
            "%d validation and %d test queries",
            lg.source,
            len(lg),
            lg.dropped_self_loops,
            lg.dropped_duplicates,
            self.users.n_entities,
            self.n_before_test,
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
        log.info(
            "warm start from %s: %d tensors carried, %d users kept, %d new%s",
            self.warm_from,
            got.tensors,
            got.ids_kept,
            got.ids_new,
            f"; fresh: {', '.join(got.fresh)}" if got.fresh else "",
        )
        return {
            "from": f"{old.manifest.name}/{old.folder.name}",
            "users_kept": got.ids_kept,
            "users_new": got.ids_new,
            "fresh_tensors": got.fresh,
            # The candidates of a social model are users: those first seen live, as serving reads them.
            FIRST_SEEN_LIVE: added_live(old.manifest.config, old.users, self.users),
        }

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
        return self._batches(model, self.examples(self.periods.valid))

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
        return evaluate_scorer(self.valid_q, self._scorer(model, self.valid_q), batch_size=self.cfg.eval.batch_size)[
            "all"
        ]

    def after_training(self, model: nn.Module, history: History) -> None:
        t = self.cfg.train
        if not t.refit_epochs:
            return
        with self.untimed():  # measured before the refit has seen the validation period
            self.valid_before_refit = self.validate(model)
        # Inside the job's budget: what the loop left, less the evaluation's and the artifact's share.
        minutes = (self.clock.left() - AFTER_SHARE * self.clock.seconds) / 60
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
                "test": len(self.test_q),
                "test_repeat_share": float(self.test_q.repeat.float().mean()) if len(self.test_q) else 0.0,
            },
            "valid_before_refit": getattr(self, "valid_before_refit", None),
            "test": evaluate_scorer(self.test_q, self._scorer(model, self.test_q), batch_size=bs),
        }
        if self.cfg.eval.baselines:
            b = Baselines(
                self.timelines,
                torch.from_numpy(self.tgt),
                self.log.time,
                len(self.users),
                contacts=self.contacts,
                contact_row=self.contact_row,
            )
            q = self.test_q
            metrics["baselines_test"] = {
                "popularity": evaluate_scorer(q, b.popularity(p.test), batch_size=bs),
                "recent_popularity": evaluate_scorer(
                    q, b.recent_popularity(q, self.cfg.eval.recent_days), batch_size=bs
                ),
                "most_recent": evaluate_scorer(q, b.most_recent(q), batch_size=bs),
                "most_recent_contact": evaluate_scorer(q, b.most_recent_contact(q), batch_size=bs),
                "most_frequent": evaluate_scorer(q, b.most_frequent(q), batch_size=bs),
            }
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


JOB = SocialJob
