"""Each worker's view of its models' catalog rules: the items hidden in the production state (every worker
and host reads them from the store each housekeeping tick), and what users take now, counted from the
store's arrivals over the recent window (what the fallback ranks a visitor by). It is the one writer of
every loaded engine's rules (models/catalog.py): each tick, and as a version loads, before it serves
(docs/decisions/catalog-rules.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import weakref
from collections import Counter
from typing import Any

from app.loaded import LoadedModels
from app.store import HiddenItem, ProductionState, StoreError
from models.catalog import CatalogRules
from models.engine import Catalog, Engine, UserHistories

log = logging.getLogger(__name__)
TAKEN_BUCKET_S = 60.0  # recent takes are counted per minute, the window's oldest minute dropped whole
ARRIVAL_PAGES = 10  # pages of arrivals one tick reads at most (the rest on the next)


class CatalogView:
    def __init__(self, *, window_s: float, min_takes: float) -> None:
        self.window_s, self.min_takes = window_s, min_takes
        self.hidden: dict[str, dict[str, HiddenItem]] = {}  # model name -> its hidden items, as last read
        self.named: dict[str, dict[str, object]] = {}  # model name -> its named filters, as last read
        self.taken: dict[str, dict[float, Counter[str]]] = {}  # namespace -> minute -> item -> takes
        self.totals: dict[str, dict[str, float]] = {}  # namespace -> item -> takes over the window
        self.generation = 0  # bumped whenever `totals` change: engines holding an older one are updated
        # An engine's rules -> the generation of recent takes they were given (gone with the engine).
        self._given: weakref.WeakKeyDictionary[CatalogRules, int] = weakref.WeakKeyDictionary()
        self.cursor: str | None = None

    def begin(self, state: ProductionState | None) -> None:
        """Count from the arrivals of the window before now that the store still keeps: a worker that starts
        or restarts knows what was just taken (its first ticks read them, pages at a time)."""
        if state is None:
            return
        try:
            self.cursor = state.first_cursor(time.time() - self.window_s)
        except StoreError as exc:
            log.warning("recent takes are counted once the store is back: %s", exc)

    def shown_hidden(self, name: str, now: float) -> frozenset[str]:
        """The items of `name` hidden now (those whose `until` passed are shown again)."""
        found = self.hidden.get(name, {})
        return frozenset(i for i, h in found.items() if h.until is None or h.until > now)

    def apply(self, name: str, engine: Engine[Any, Any, Any]) -> None:
        """Give `engine` (a version of `name`) the hidden items and recent takes as they are now."""
        if not isinstance(engine, Catalog):
            return
        if engine.rules.hide(self.shown_hidden(name, time.time())):
            log.info("%s/%s: %d items hidden", name, engine.manifest.version, len(engine.rules.hidden_ids))
        engine.rules.named = self.named.get(name, {})
        if isinstance(engine, UserHistories) and self._given.get(engine.rules) != self.generation:
            engine.rules.take_counts(self.totals.get(engine.namespace, {}), min_takes=self.min_takes)
            self._given[engine.rules] = self.generation

    async def tick(self, state: ProductionState | None, loaded: LoadedModels) -> None:
        """Every housekeeping tick: read new arrivals and the hidden items, then update every loaded engine."""
        if state is not None:
            try:
                await self._count(state)
                found = await asyncio.to_thread(lambda: {name: state.hidden(name) for name in loaded.names})
                named = await asyncio.to_thread(lambda: {name: state.filters(name) for name in loaded.names})
                self.hidden, self.named = found, {n: _expressions(f) for n, f in named.items()}
            except StoreError as exc:
                log.warning("catalog rules kept as last read (the store is away): %s", exc)
        entries = [*loaded.models.values(), *loaded.candidate_models.values()]
        for served in entries:
            self.apply(served.name, served.engine)

    async def refresh(self, state: ProductionState | None, loaded: LoadedModels, name: str) -> None:
        """Read `name`'s hidden items now and give them to its loaded versions (an admin call, on its worker)."""
        if state is None:
            return
        try:
            found = await asyncio.to_thread(state.hidden, name)
            named = await asyncio.to_thread(state.filters, name)
        except StoreError as exc:
            log.warning("catalog rules of %s not read (the store is away): %s", name, exc)
            return
        self.hidden = {**self.hidden, name: found}
        self.named = {**self.named, name: _expressions(named)}
        for entries in (loaded.models, loaded.candidate_models):
            if (served := entries.get(name)) is not None:
                self.apply(name, served.engine)

    async def _count(self, state: ProductionState) -> None:
        if self.cursor is None:
            self.cursor = await asyncio.to_thread(state.first_cursor, time.time() - self.window_s)
        changed = False
        for _ in range(ARRIVAL_PAGES):
            self.cursor, arrivals = await asyncio.to_thread(state.arrivals, self.cursor, 2_000)
            for a in arrivals:
                minute = math.floor(a.at / TAKEN_BUCKET_S) * TAKEN_BUCKET_S
                self.taken.setdefault(a.namespace, {}).setdefault(minute, Counter())[a.item] += 1
            changed |= bool(arrivals)
            if len(arrivals) < 2_000:
                break
        oldest = time.time() - self.window_s
        for buckets in self.taken.values():
            for minute in [m for m in buckets if m + TAKEN_BUCKET_S <= oldest]:
                del buckets[minute]
                changed = True
        if changed:
            totals: dict[str, dict[str, float]] = {}
            for ns, buckets in self.taken.items():
                total: Counter[str] = Counter()
                for counts in buckets.values():
                    total.update(counts)
                if total:
                    totals[ns] = {item: float(n) for item, n in total.items()}
            self.totals = totals
            self.generation += 1


def _expressions(stored: dict[str, str]) -> dict[str, object]:
    """Named filters as stored (JSON text, written by the admin call) -> their expressions."""
    out: dict[str, object] = {}
    for name, spec in stored.items():
        try:
            out[name] = json.loads(spec)
        except ValueError:
            log.error("named filter %s is not JSON: left out", name)
    return out
