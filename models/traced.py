"""A model's `scores()` as one traced graph, for serving.

Why: eager PyTorch lets go of the GIL inside each op and takes it back before the next. A served
forward pass is 100-400 small ops, and the event loop holds the GIL whenever it has work, so the
batcher's model thread waits before every op and the two threads take turns instead of running
side by side. A traced graph runs in C++ and takes the GIL back once per call
(docs/decisions/traced-scoring.md: 1.2-1.4x req/s on /recommend at 1, 16 and 64 clients, one worker).

Traced at load from the weights already loaded (nothing but the checkpoint is deserialized) and kept
only when the tracer saw no value-dependent step and the traced scores equal eager ones on every
example batch; otherwise the engine keeps eager and says why. `torch.jit.trace` is deprecated in
favour of `torch.compile` / `torch.export`, which either run op by op from Python as well or need a
C compiler at run time; torch is pinned, and the tests trace every shipped model.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import torch
from torch import nn

B = TypeVar("B")
log = logging.getLogger(__name__)


class NotTraceable(RuntimeError):
    """The model's scores() cannot be served as a trace; the message says why."""


def _flatten(batch: Any) -> tuple[tuple[str, ...] | None, tuple[torch.Tensor, ...]]:
    """A tensor, or a dataclass of tensors (None fields left out) -> (field names or None, tensors)."""
    if isinstance(batch, torch.Tensor):
        return None, (batch,)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        pairs = [(f.name, getattr(batch, f.name)) for f in dataclasses.fields(batch)]
        pairs = [(n, t) for n, t in pairs if t is not None]
        if not all(isinstance(t, torch.Tensor) for _, t in pairs):
            raise NotTraceable(f"{type(batch).__name__} holds something other than tensors")
        return tuple(n for n, _ in pairs), tuple(t for _, t in pairs)
    raise NotTraceable(f"scores() takes a {type(batch).__name__}, not a tensor or a dataclass of tensors")


def _eager(model: nn.Module, method: str) -> Callable[[Any], torch.Tensor]:
    """The model's own `method` (nn.Module types its attributes as tensors or modules)."""
    return cast(Callable[[Any], torch.Tensor], getattr(model, method))


class _Flat(nn.Module):
    """scores() over flat tensors, so the trace takes the model's weights as parameters."""

    def __init__(self, model: nn.Module, kind: type, names: tuple[str, ...] | None, method: str) -> None:
        super().__init__()
        self.model, self.kind, self.names, self.method = model, kind, names, method

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        batch = tensors[0] if self.names is None else self.kind(**dict(zip(self.names, tensors, strict=True)))
        return _eager(self.model, self.method)(batch)


class TracedScores(Generic[B]):
    """`model.scores` (or another `method` of it) as one TorchScript trace; a batch whose fields differ
    from the examples' goes eager."""

    def __init__(self, model: nn.Module, examples: Sequence[B], *, atol: float = 1e-4, method: str = "scores") -> None:
        if not examples:
            raise NotTraceable("no example batch to trace with")
        if model.training:
            raise NotTraceable("the model is in training mode")
        self.model, self.method = model, method
        self.names, first = _flatten(examples[0])
        wrapper = _Flat(model, type(examples[0]), self.names, method)
        with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                self.fn: Callable[..., torch.Tensor] = torch.jit.trace(wrapper, first, check_trace=False)
            except Exception as exc:  # the tracer refuses many constructs; each means "stay eager"
                raise NotTraceable(f"tracing failed: {str(exc).splitlines()[0]}") from exc
        # A TracerWarning marks a tensor turned into a Python value: a branch or a size fixed for
        # every later batch. Such a trace could be right on the examples and wrong on others.
        fixed = [
            f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0]}"
            for w in seen
            if issubclass(w.category, torch.jit.TracerWarning)
        ]
        if fixed:
            raise NotTraceable("value-dependent step in scores(): " + " | ".join(fixed))
        with torch.inference_mode():
            for n, ex in enumerate(examples):
                want, got = _eager(model, method)(ex), self(ex)
                if want.shape != got.shape or not torch.allclose(want, got, atol=atol, equal_nan=True):
                    raise NotTraceable(
                        f"traced scores differ from eager ones on example batch {n} "
                        f"of shape {tuple(_flatten(ex)[1][0].shape)}"
                    )

    def __call__(self, batch: B) -> torch.Tensor:
        names, tensors = _flatten(batch)
        if names != self.names:
            return _eager(self.model, self.method)(batch)
        return self.fn(*tensors)


# Batches a trace is checked on: (rows, longest row). The first is traced; the others differ in batch
# size and length (padding), so a size the trace fixed would show as a mismatch.
EXAMPLE_SHAPES = ((8, None), (1, None), (3, 7), (33, None))


def example_rows(low: int, high: int, *, max_len: int, seed: int = 0) -> list[list[list[int]]]:
    """Index rows in [low, high) for each of EXAMPLE_SHAPES; each batch's first row is its longest."""
    rng = random.Random(seed)
    out = []
    for rows, longest in EXAMPLE_SHAPES:
        top = min(longest or max_len, max_len)
        lengths = [top] + [rng.randint(1, top) for _ in range(rows - 1)]
        out.append([[rng.randrange(low, high) for _ in range(n)] for n in lengths])
    return out


def serving_scores(
    model: nn.Module, examples: Callable[[], Sequence[B]], *, enabled: bool, method: str = "scores"
) -> tuple[Callable[[B], torch.Tensor], str]:
    """-> (the model's `method` to serve with, how it runs: "traced", or "eager" and why)."""
    if not enabled:
        return _eager(model, method), "eager (tracing off)"
    try:
        return TracedScores(model, examples(), method=method), "traced"
    except NotTraceable as exc:
        log.warning("serving %s eagerly: %s", type(model).__name__, exc)
        return _eager(model, method), f"eager ({exc})"
