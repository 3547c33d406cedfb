"""The training loop's clock: the budget is a deadline inside an epoch, and a long epoch reports progress."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import torch
from torch import nn

from training import loop
from training.config import LoopConfig


class Slow(nn.Module):
    """A model whose every step takes `seconds`: a stand-in for a large catalog's epoch."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4))
        self.seconds, self.steps = seconds, 0

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        self.steps += 1
        return ((batch @ self.w) - 1).pow(2).mean()


def batches(n: int) -> Any:
    return lambda gen: [torch.ones(8, 4) for _ in range(n)]


class Clock:
    """The loop's clock, moved only by the model's steps: the test does not depend on the machine's speed."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Ticking(nn.Module):
    """A model whose every step moves the clock by `seconds`."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4))
        self.clock, self.seconds, self.steps = clock, seconds, 0

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        self.clock.now += self.seconds
        self.steps += 1
        return ((batch @ self.w) - 1).pow(2).mean()


def test_the_budget_stops_training_inside_an_epoch_with_the_best_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(loop, "time", clock)
    model = Ticking(clock, 1 / 32)  # a binary fraction: 16 steps are exactly the half second
    validations: list[int] = []

    def validate(m: nn.Module) -> dict[str, float]:
        validations.append(model.steps)
        return {"NDCG@10": float(model.steps)}

    cfg = LoopConfig(epochs=5, max_minutes=0.5 / 60, lr=0.1)  # half a second; an epoch of 400 steps is 12.5 s
    hist = loop.train(model, batches(400), cfg, validate=validate)
    assert model.steps == 16 and hist.epoch == [1] and validations == [16]
    assert hist.stopped.startswith("time budget of 0.00833333 minutes reached in epoch 1 after ")
    assert hist.best_epoch == 1 and float(model.w.detach().abs().sum()) > 0  # the trained weights were kept


def test_a_long_epoch_logs_its_progress_without_a_bar(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(loop, "LOG_EVERY_S", 0.1)
    caplog.set_level(logging.INFO, logger="training.loop")
    loop.train(Slow(0.01), batches(60), LoopConfig(epochs=1, max_minutes=10), validate=None)
    lines = [r.getMessage() for r in caplog.records if "% of 60 batches" in r.getMessage()]
    assert len(lines) >= 3, lines  # pytest's stderr is no terminal: no bar, log lines
    assert all("rows/s" in line and "left in the epoch" in line for line in lines)


def test_a_long_evaluation_logs_its_progress(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from training.jobs import recommend_eval as ev
    from training.splits import EvalSet

    monkeypatch.setattr(ev, "LOG_EVERY_S", 0.05)
    caplog.set_level(logging.INFO, logger="training.jobs.recommend_eval")
    data = EvalSet(users=list(range(40)), histories=[[3, 4]] * 40, targets=[5] * 40, interacted=[[3, 4, 5]] * 40)

    def slow_scores(seq: torch.Tensor) -> torch.Tensor:
        time.sleep(0.03)
        return torch.rand(len(seq), 10)

    out = ev.evaluate(slow_scores, data, vocab_size=10, max_history=4, protocol=ev.Protocol(batch_size=4))
    lines = [r.getMessage() for r in caplog.records if "% of 40 users" in r.getMessage()]
    assert out["n"] == 40 and len(lines) >= 3 and all("users/s" in line for line in lines), lines


def test_fitting_item_knn_over_many_blocks_logs_its_progress(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from training.jobs import recommend_eval as ev

    monkeypatch.setattr(ev, "LOG_EVERY_S", 0.0)
    monkeypatch.setattr(ev, "KNN_BLOCK_PAIRS", 4)  # a block of a few items each
    caplog.set_level(logging.INFO, logger="training.jobs.recommend_eval")
    ev.item_knn_scorer([[2, 3, 4], [3, 4, 5], [5, 6, 2]], 8)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fitting item_knn")]
    assert len(lines) >= 3 and all("% of 8 items" in line for line in lines), lines


@pytest.mark.parametrize("by_length", [True, False])
def test_window_batches_cover_every_window_once_trimmed(by_length: bool) -> None:
    lengths = [2, 9, 3, 8, 2, 9, 3, 8, 5, 5, 7, 4]
    windows = torch.zeros(len(lengths), 10, dtype=torch.long)
    for row, n in enumerate(lengths):
        windows[row, :n] = torch.arange(1, n + 1) + 100 * row
    batches = loop.window_batches(windows, 4, by_length=by_length)(torch.Generator().manual_seed(0))
    rows = sorted(int(b[i, 0]) // 100 for b in batches for i in range(len(b)))
    assert rows == list(range(len(lengths)))
    assert all(b.size(1) == int((b != 0).sum(1).max()) for b in batches)  # trimmed to the longest row
    got = sorted(sorted((b != 0).sum(1).tolist()) for b in batches)
    ranked = sorted(lengths)
    if by_length:  # similar lengths together: the batches are the sorted lengths cut in fours
        assert got == [ranked[i : i + 4] for i in range(0, len(ranked), 4)]
    else:  # shuffled: some batch mixes short and long windows
        assert max(b[-1] - b[0] for b in got) >= 4


class Walk(nn.Module):
    """A constant gradient: Adam moves the weight by `lr` a step, so its path is -lr, -2 lr, ..."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        return self.w.sum() * batch.sum() / batch.numel()


@pytest.mark.parametrize("ema_epochs", [0.0, 1.0, 2.5])
def test_the_moving_average_of_the_weights_is_what_is_validated_and_kept(ema_epochs: float) -> None:
    steps, lr = 10, 0.1
    validated: list[float] = []

    def validate(m: nn.Module) -> dict[str, float]:
        validated.append(float(m.w.detach()))  # type: ignore[operator]
        return {"NDCG@10": 1.0}

    model = Walk()
    loop.train(model, batches(steps), LoopConfig(epochs=1, lr=lr, ema_epochs=ema_epochs), validate=validate)
    expected = -lr * steps  # the last step's weight
    if ema_epochs:
        decay, expected = 1 - 1 / (ema_epochs * steps), -lr  # the average starts at the first step's weight
        for t in range(2, steps + 1):
            expected = decay * expected + (1 - decay) * -lr * t
    assert validated == pytest.approx([expected], abs=1e-5)
    assert float(model.w.detach()) == pytest.approx(expected, abs=1e-5)


def test_a_budget_of_no_time_is_refused() -> None:
    from training.config import LoopConfig

    for minutes in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="max_minutes"):
            LoopConfig(max_minutes=minutes)
    assert LoopConfig(max_minutes=0.0001).max_minutes == 0.0001
