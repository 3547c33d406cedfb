"""Each version's answers on this worker: how many, how many ended in a 5xx, and their latencies, per
minute, until the production loop adds them to the production state's shared figures (where every
worker's and host's add up); probation compares a new live version's with the version it replaced
(app/production.py). The request path's middleware observes every answer of a task route."""

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

    def observe(self, model: str, version: str, status: int, seconds: float, *, now: float | None = None) -> None:
        """One answer of `version` of `model`: its HTTP status and how long it took."""
        bucket = math.floor((now if now is not None else time.time()) / MINUTE_S) * MINUTE_S
        key = (model, version, bucket)
        t = self._rows.get(key)
        if t is None:
            t = self._rows[key] = Traffic()
        t.n += 1
        t.errors += status >= 500
        i = bisect.bisect_left(LATENCY_EDGES_S, seconds)
        t.hist[i] = t.hist.get(i, 0.0) + 1

    def take(self) -> dict[TrafficKey, Traffic]:
        """The answers since the last take."""
        out, self._rows = self._rows, {}
        return out
