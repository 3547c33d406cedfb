"""Plain types the settings build and the request path reads: a request's bounds and the batch policy.

Settings-side on purpose: app/settings.py takes its defaults from here without importing the batcher
or the request schemas, and those import these types back from here.
"""

from __future__ import annotations

from dataclasses import dataclass

# On the CPU the model's cost per query is flat from batch 16 up (docs/decisions/cpu-batch-cap.md), so
# a large batch buys nothing there. A cap under the number of clients splits a closed loop of them into
# cohorts that alternate: the event loop answers one and parses its next requests while the model
# runs the other (measured in docs/decisions/cpu-batch-cap.md).
CPU_MAX_BATCH = 32


@dataclass(frozen=True)
class Limits:
    """The bounds of a request, from the settings."""

    max_queries: int = 1024
    max_k: int = 1000
    max_history: int = 2000
    max_exclude_items: int = 1000
    max_total_k: int = 20_000  # sum of k over a request's queries
    max_total_items: int = 100_000  # history events plus excluded items over a request's queries
    max_events: int = 1000


@dataclass(frozen=True)
class BatchPolicy:
    """How a batcher groups requests; the service's settings default to these values."""

    enabled: bool = True
    max_batch_size: int = 256  # queries per model call; the service's default on the CPU is CPU_MAX_BATCH
    max_wait_ms: float = 2.0  # longest wait for more when others are queued
    max_queue: int = 1024  # waiting requests (or chunks of a large one) before QueueFullError
