"""The training loop: epochs with validation, early stopping, best weights kept; on any device."""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm import tqdm

from training.config import LoopConfig
from training.distributed import Dist

log = logging.getLogger(__name__)
M = TypeVar("M", bound=nn.Module)
BAR_EVERY = 50  # steps between progress-bar updates: each reads the loss back from the device
LOG_EVERY_S = 30.0  # without a progress bar (logs, CI), a progress line at least this often
# Steps between deadline checks under torchrun: every rank takes rank 0's clock (a broadcast), so
# all stop at the same step. Alone, the clock is read every step (about 50 ns).
DIST_CHECK_EVERY = 50


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CUDA when asked (or by default); on the CPU only when asked explicitly."""
    use = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    if not use:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def length_buckets(lengths: torch.Tensor, batch_size: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Shuffled batches of rows of similar length.

    Most sequences are far shorter than the window (Beauty: 9 items on average against 50), so
    random batches would be mostly padding; sorting a shuffled order by length and shuffling the
    batches keeps the gradient noise while computing little padding.
    """
    order = torch.randperm(len(lengths), generator=gen)
    order = order[torch.sort(lengths[order], stable=True).indices]
    batches = list(order.split(batch_size))
    perm = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[i] for i in perm]


@dataclass
class History:
    epoch: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    val: list[dict[str, float]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    best_epoch: int = 0
    stopped: str = ""


def window_batches(
    windows: torch.Tensor, batch_size: int, *, by_length: bool = True
) -> Callable[[torch.Generator], list[torch.Tensor]]:
    """Per-epoch batches of right-padded windows (N, L), bucketed by length (else shuffled) and trimmed.

    `windows` may live on the training device: batches are then cut there, never copied per step.
    """
    lengths = (windows != 0).sum(1).cpu()

    def make(gen: torch.Generator) -> list[torch.Tensor]:
        batches = (
            length_buckets(lengths, batch_size, gen)
            if by_length
            else list(torch.randperm(len(lengths), generator=gen).split(batch_size))
        )
        return [windows[idx.to(windows.device)][:, : int(lengths[idx].max())] for idx in batches]

    return make


def _to(batch: Any, device: torch.device) -> Any:
    return batch.to(device, non_blocking=True) if hasattr(batch, "to") else batch


class Budget:
    """The share of the wall-clock budget spent, as every rank sees it: alone, read at every step
    (about 50 ns); under torchrun, rank 0's clock every DIST_CHECK_EVERY steps (a broadcast), so all
    ranks stop at the same step and take the same learning rate."""

    def __init__(self, minutes: float, dist: Dist) -> None:
        self.t0, self.seconds, self.dist = time.monotonic(), minutes * 60, dist
        self.spent = 0.0

    def elapsed(self) -> float:
        """Seconds since the start on this rank's clock."""
        return time.monotonic() - self.t0

    def update(self, step_no: int) -> float:
        if not self.dist.enabled:
            self.spent = self.elapsed() / self.seconds
        elif step_no % DIST_CHECK_EVERY == 0:
            (self.spent,) = self.dist.from_main(self.elapsed() / self.seconds)
        return self.spent


def _score(val: dict[str, float], key: str, train_loss: float) -> float:
    """Higher is better: the validation metric, negated for a "-name" key; without validation, -loss."""
    name, sign = (key[1:], -1.0) if key.startswith("-") else (key, 1.0)
    return sign * val[name] if name in val else -train_loss


def lr_schedule(
    opt: torch.optim.Optimizer, cfg: LoopConfig, *, steps_per_epoch: int, budget: Budget | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `cfg.warmup_steps`, then constant or a cosine decay that reaches 0 at
    `cfg.epochs` or when the `budget` is spent, whichever comes first (docs/decisions/lr-schedule.md)."""
    warm, total = cfg.warmup_steps, max(cfg.epochs * steps_per_epoch, cfg.warmup_steps + 1)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if cfg.schedule == "cosine":
            done = max((step - warm) / (total - warm), budget.spent if budget else 0.0)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, done)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def weight_average(model: M, cfg: LoopConfig, *, steps_per_epoch: int) -> AveragedModel | None:
    """An exponential moving average of `model`'s weights over about `cfg.ema_epochs` epochs (a decay
    of 1 - 1 / steps), or None when the config asks for none."""
    if cfg.ema_epochs <= 0:
        return None
    decay = 1.0 - 1.0 / max(cfg.ema_epochs * steps_per_epoch, 1.0)
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))


def train(
    model: M,
    make_batches: Callable[[torch.Generator], Sequence[Any]],
    cfg: LoopConfig,
    *,
    validate: Callable[[M], dict[str, float]] | None,
    key_metric: str = "NDCG@10",
    dist: Dist | None = None,
    device: torch.device | None = None,
) -> History:
    """Train `model` on the batches `make_batches` draws each epoch; keep the weights of the best
    validation `key_metric` (highest; "-name" = lowest of `name`). Without `validate` the lowest
    training loss decides. With `cfg.ema_epochs`, the weights validated and kept are the moving average.
    Under torchrun (`dist`), each rank trains on its share of the batches; rank 0 validates (every rank,
    each on its own users, where each holds its own: `validate` pools them on rank 0).
    """
    dist = dist or Dist()
    device = device or next(model.parameters()).device
    step = dist.wrap(model)
    # The fused kernel: Adam over a large item table is a real cost on the CPU (docs/decisions/training-throughput.md).
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    gen = torch.Generator().manual_seed(cfg.seed)
    sched: torch.optim.lr_scheduler.LambdaLR | None = None
    hist = History()
    best_score, best_state, bad = -float("inf"), copy.deepcopy(model.state_dict()), 0
    budget = Budget(cfg.max_minutes, dist)
    ema: AveragedModel | None = None
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        te = time.monotonic()
        batches = dist.shard(make_batches(gen))
        if sched is None and (cfg.warmup_steps or cfg.schedule != "constant"):
            sched = lr_schedule(opt, cfg, steps_per_epoch=len(batches), budget=budget)
        if epoch == 1:
            ema = weight_average(model, cfg, steps_per_epoch=len(batches))
        epoch_loss, seen, cut = _one_epoch(
            model, step, batches, epoch=epoch, opt=opt, sched=sched, ema=ema, cfg=cfg, budget=budget, device=device
        )
        trained_s = time.monotonic() - te  # the steps alone: a GPU validates a large share of an epoch
        kept = model if ema is None else cast(M, ema.module)  # the weights validated and kept
        kept.eval()
        val = validate(kept) if validate and (dist.is_main or dist.own_data) else {}
        validated_s = time.monotonic() - te - trained_s
        hist.epoch.append(epoch)
        hist.loss.append(epoch_loss)
        hist.val.append(val)
        # Every rank takes rank 0's score and clock, so all stop at the same epoch.
        score, elapsed = dist.from_main(_score(val, key_metric, epoch_loss), budget.elapsed())
        hist.seconds.append(elapsed)
        log.info(
            "epoch %d loss %.4f %s (%.0fs, %.0f rows/s training, validation %.1fs)",
            epoch,
            epoch_loss,
            " ".join(f"{k} {v:.4f}" for k, v in val.items() if k != "n"),
            hist.seconds[-1],
            seen / max(trained_s, 1e-9),
            validated_s,
        )
        if score > best_score:
            best_score, bad, hist.best_epoch = score, 0, epoch
            best_state = copy.deepcopy(kept.state_dict())
        else:
            bad += 1
            if bad >= cfg.patience:
                hist.stopped = f"early stop: no better validation for {cfg.patience} epochs"
                break
        if cut or hist.seconds[-1] > budget.seconds:
            hist.stopped = f"time budget of {cfg.max_minutes:g} minutes reached in epoch {epoch}{cut}"
            break
    else:
        hist.stopped = f"all {cfg.epochs} epochs"
    model.load_state_dict(best_state)
    model.eval()
    log.info("stopped (%s); best epoch %d", hist.stopped, hist.best_epoch)
    return hist


def _one_epoch(
    model: nn.Module,
    step: Callable[[Any], torch.Tensor],
    batches: Sequence[Any],
    *,
    epoch: int,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LambdaLR | None,
    ema: AveragedModel | None,
    cfg: LoopConfig,
    budget: Budget,
    device: torch.device,
) -> tuple[float, int, str]:
    """One pass over `batches` (cut short when the budget runs out) -> (mean loss, rows seen, where it
    was cut: "" for a whole epoch)."""
    total = torch.zeros((), device=device)  # summed on the device: no host sync per step
    seen, te = 0, time.monotonic()
    # disable=None: a bar on a terminal, none in logs and CI (a log line every LOG_EVERY_S instead).
    bar = tqdm(batches, desc=f"epoch {epoch}", leave=False, mininterval=1.0, disable=None)
    last_line, cut = te, ""
    for n, batch in enumerate(bar):
        spent = budget.update(n)  # every step: the cosine schedule reads it too
        if n and spent >= 1.0:
            # The budget is a deadline, also inside an epoch: what was trained so far is validated
            # and kept if it is the best, as after a whole epoch.
            cut = f" after {n} of {len(batches)} batches"
            break
        batch = _to(batch, device)
        with autocast(device, cfg.precision):
            loss = step(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad_norm)
        opt.step()
        if sched is not None:
            sched.step()
        if ema is not None:
            ema.update_parameters(model)
        total += loss.detach().float() * len(batch)
        seen += len(batch)
        if not bar.disable and n % BAR_EVERY == 0:
            bar.set_postfix(loss=f"{total.item() / seen:.4f}", seq_s=f"{seen / (time.monotonic() - te):.0f}")
        elif bar.disable and time.monotonic() - last_line >= LOG_EVERY_S:
            last_line = time.monotonic()
            done, spent = (n + 1) / len(batches), last_line - te
            log.info(
                "epoch %d: %.0f%% of %d batches, loss %.4f, %.0f rows/s, about %.0fs left in the epoch",
                epoch,
                100 * done,
                len(batches),
                total.item() / seen,
                seen / spent,
                spent / done - spent,
            )
    return total.item() / max(seen, 1), seen, cut
