"""The recommendation training job: data -> split -> train -> evaluate -> artifact."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import torch

from models.base import SequentialRecommender
from models.ids import IdMap
from models.registry import build_recommender
from training.config import RunConfig
from training.data import Interactions
from training.distributed import Dist
from training.evaluate import evaluate, item_counts, popularity_scorer
from training.export import export_recommender
from training.loop import seed_everything, train, window_batches
from training.preflight import preflight
from training.splits import EvalSet, Split, leave_one_out, pad_right, windows

EVALSET_FIELDS = ("users", "histories", "targets", "interacted")

log = logging.getLogger(__name__)


def index_data(data: Interactions) -> tuple[IdMap, IdMap, list[list[int]]]:
    items = IdMap(data.item_set())
    users = IdMap(data.users)
    return items, users, [items.indices(seq) for seq in data.items]


def _model_config(cfg: RunConfig, vocab_size: int) -> dict[str, Any]:
    return {**cfg.model, "vocab_size": vocab_size}


def evaluate_all(
    model: SequentialRecommender | None, cfg: RunConfig, split: Any, vocab: int, popularity: torch.Tensor,
    max_history: int, which: str = "test",
) -> dict[str, dict[str, float]]:
    """Full ranking and both sampled protocols for `model` (None = popularity baseline)."""
    t = cfg.train
    sets = getattr(split, which)
    if model is None:
        score_fn, _ = popularity_scorer(split.train, vocab)
    else:
        score_fn = model.scores
    out = {}
    for protocol in ("full", "popularity", "uniform"):
        out[protocol] = evaluate(
            score_fn, sets, vocab, max_history, protocol, t.n_eval_negatives, popularity,
            t.exclude_seen, t.eval_batch_size, seed=t.seed,
        )
    return out


def short_sequences(split: Split) -> list[list[int]]:
    """Training sequences of the users too short to hold anything out (they are not in test)."""
    held = set(split.test.users)
    return [s for u, s in enumerate(split.train) if u not in held]


def train_recommender(cfg: RunConfig, data: Interactions, out_root: Path, dist: Dist | None = None) -> Path | None:
    """Train, evaluate and export; returns the artifact folder (None on ranks other than 0)."""
    t = cfg.train
    dist = dist or Dist()
    if t.threads:
        torch.set_num_threads(t.threads)
    seed_everything(t.seed)
    items, users, sequences = index_data(data)
    vocab = len(items)
    model = build_recommender(cfg.kind, _model_config(cfg, vocab))
    seed_everything(t.seed + dist.rank)  # same initial weights everywhere; each rank its own negatives
    split = leave_one_out(sequences, full_data=t.full_data)
    win_len = model.window_len
    rows = windows(split.train, win_len, min_len=2)
    win = torch.tensor(pad_right(rows, win_len), dtype=torch.long)
    popularity = item_counts(sequences, vocab)  # the paper's negative sampler: counts over the whole log
    log.info(
        "%s: %d users, %d items, %d interactions; %d training windows of <= %d; %d validation targets",
        data.source, len(users) - 2, vocab - 2, data.n_interactions, len(rows), win_len, len(split.valid.targets),
    )

    val_set = split.valid
    if t.val_users and len(val_set.targets) > t.val_users:
        g = torch.Generator().manual_seed(t.seed)
        keep = sorted(torch.randperm(len(val_set.targets), generator=g)[: t.val_users].tolist())
        val_set = EvalSet(*[[getattr(val_set, f)[i] for i in keep] for f in EVALSET_FIELDS])
    max_history = model.max_history

    def validate(m: SequentialRecommender) -> dict[str, float]:
        return evaluate(
            m.scores, val_set, vocab, max_history, t.eval_negatives, t.n_eval_negatives,
            popularity, t.exclude_seen, t.eval_batch_size, seed=t.seed,
        )

    t0 = time.monotonic()
    model.set_item_frequencies(item_counts(split.train, vocab))
    preflight(model, win[: t.batch_size], vocab)
    history = train(model, window_batches(win, t.batch_size), t, validate if val_set.targets else None, dist=dist)
    valid_metrics = None
    if not t.full_data:
        # Measured here, before a refit has seen the validation items.
        if dist.is_main:
            tv = time.monotonic()
            valid_metrics = evaluate_all(model, cfg, split, vocab, popularity, max_history, "valid")
            t0 += time.monotonic() - tv  # evaluation, not training: kept out of train_seconds
        if t.refit_epochs:
            # The validation target joins the training data; the test item stays held out.
            refit_rows = windows(split.test.histories + short_sequences(split), win_len, min_len=2)
            refit = torch.tensor(pad_right(refit_rows, win_len), dtype=torch.long)
            refit_cfg = dataclasses.replace(t, epochs=t.refit_epochs, patience=t.refit_epochs + 1)
            log.info("refit: %d more epochs on %d windows with the validation items", t.refit_epochs, len(refit_rows))
            refit_hist = train(model, window_batches(refit, t.batch_size), refit_cfg, None, dist=dist)
            history.stopped += f"; then {len(refit_hist.epoch)} refit epochs with the validation items"
    train_seconds = time.monotonic() - t0
    if not dist.is_main:
        return None  # the weights are rank 0's too; it evaluates and writes the one artifact
    metrics: dict[str, Any] = {
        "train_seconds": round(train_seconds, 1),
        "best_epoch": history.best_epoch,
        "epochs_run": len(history.epoch),
        "stopped": history.stopped,
        "ranks": dist.world,
        "protocol": {
            "split": "full_data" if t.full_data else "leave_one_out",
            "refit_epochs_with_validation_items": t.refit_epochs,
            "n_negatives": t.n_eval_negatives,
            "exclude_seen_in_full_ranking": t.exclude_seen,
            "ties": "count against the target",
        },
    }
    if not t.full_data:
        t1 = time.monotonic()
        metrics["valid"] = valid_metrics
        metrics["test"] = evaluate_all(model, cfg, split, vocab, popularity, max_history, "test")
        metrics["baseline_popularity_test"] = evaluate_all(None, cfg, split, vocab, popularity, max_history, "test")
        metrics["eval_seconds"] = round(time.monotonic() - t1, 1)
        for proto in ("popularity", "full"):
            m, b = metrics["test"][proto], metrics["baseline_popularity_test"][proto]
            log.info(
                "test (%s): HR@10 %.4f NDCG@10 %.4f MRR %.4f | popularity baseline HR@10 %.4f NDCG@10 %.4f",
                proto, m["HR@10"], m["NDCG@10"], m["MRR"], b["HR@10"], b["NDCG@10"],
            )
    metrics["history"] = {"epoch": history.epoch, "loss": history.loss, "val": history.val}
    run_config = cfg.to_dict()
    run_config["model"] = _model_config(cfg, vocab)
    return export_recommender(
        out_root, cfg.name, cfg.kind, model, items, users, data, metrics, run_config, history
    )
