"""Each version's answers on this worker: how many, how many failed on the version's side (a 5xx), and
their cost, per minute, until the production loop adds them to the production state's shared figures
(where every worker's and host's add up); probation compares a promoted version's with its holdback's over
the same time (app/production/promotion.py). The request path (app/production/trials.py) observes each
part of a request a version computed, and only in requests holding a by-user query (which needs a key
wherever one is set), so no keyless client moves these figures (docs/decisions/sequential-tests.md)."""

from __future__ import annotations

import bisect
import math
import time

from app.store import Traffic, TrafficKey
from app.store.state import LATENCY_EDGES_S

MINUTE_S = 60.0


class VersionTraffic:
    def __init__(self) -> None:
        self._rows: dict[TrafficKey, Traffic] = {}

    def observe(self, model: str, version: str, *, failed: bool, seconds: float, now: float | None = None) -> None:
        """One part of a request that `version` of `model` answered: whether it failed on the version's side,
        and its cost, seconds per query of the part (a client chooses a request's size, not its cost per query)."""
        bucket = math.floor((now if now is not None else time.time()) / MINUTE_S) * MINUTE_S
        key = (model, version, bucket)
        t = self._rows.get(key)
        if t is None:
            t = self._rows[key] = Traffic()
        t.n += 1
        t.errors += failed
        i = bisect.bisect_left(LATENCY_EDGES_S, seconds)
        t.hist[i] = t.hist.get(i, 0.0) + 1

    def take(self) -> dict[TrafficKey, Traffic]:
        """The answers since the last take."""
        out, self._rows = self._rows, {}
        return out
