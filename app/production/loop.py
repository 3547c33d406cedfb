"""The production loop's periodic work on each worker: score what was served against the events
that followed, share the sums, and apply the promotion rule to a candidate version.

Every worker reads the store's arrivals (own events in the order they were stored, whoever took
them) and scores the lists it served itself (app/production/online.py); its sums go to the store, where the
figures of every worker and host add up. The rule reads those shared figures, so any worker may
apply it: the store's `settle` lets only the first one change anything, and every worker (this one
included) then follows the new pin and candidate at its next housekeeping tick.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from functools import partial
from pathlib import Path
from typing import Any

from app.choices import VersionChoices
from app.loaded import LoadedModels
from app.observability import Metrics
from app.production.online import ExposureFigures, ServedList, ServedLists, exposure_of
from app.production.promotion import Verdict, live_and_floor, probation, probation_sides, sagged, verdict
from app.production.traffic import MINUTE_S, VersionTraffic
from app.settings import LoopPolicy
from app.store import (
    EXPOSURE_BUCKET_S,
    Candidate,
    Exposure,
    ExposureKey,
    OnlineKey,
    ProductionState,
    StoreError,
    Sums,
    Traffic,
    TrafficKey,
    UserKey,
)
from app.store.state import segment_of
from app.workers import Coordinator
from models.artifact import artifact_names, version_time
from models.engine import UserHistories

log = logging.getLogger(__name__)
SETTLE_MARGIN_S = 1.0
COVERAGE_READ_S = 30.0  # how often a worker sets its coverage and floor gauges from the shared figures


class ProductionLoop:
    def __init__(
        self,
        *,
        policy: LoopPolicy,
        loaded: LoadedModels,
        state: ProductionState | None,
        metrics: Metrics,
        lists: ServedLists | None,
        traffic: VersionTraffic | None = None,
    ) -> None:
        self.policy, self.loaded, self.state, self.metrics, self.lists = policy, loaded, state, metrics, lists
        self.traffic = traffic  # this worker's answers per version, added to the shared ones every tick
        self._unsent_traffic: dict[TrafficKey, Traffic] = {}
        self.cursor: str | None = None
        self.online: dict[str, dict[OnlineKey, Sums]] = {}  # model name -> the shared totals, as last read
        self._unsent: dict[OnlineKey, Sums] = {}  # sums the store did not take yet (it was away)
        self._unsent_users: dict[UserKey, list[float]] = {}
        self._unsent_exposure: dict[ExposureKey, Exposure] = {}
        # The items this worker already added to the store per exposure key, of the current buckets only: each
        # tick then sends the items new to it (a few, once a bucket is under way), not every item it showed.
        self._sent_items: dict[ExposureKey, set[str]] = {}
        self._coverage_read = 0.0  # when the coverage and floor gauges were last set from the store
        # Model name -> its running trial and what the rule reads of it, as of the last housekeeping tick.
        self.trials: dict[str, tuple[Candidate, Verdict]] = {}
        # Model name -> its promotion on probation and what probation last read of it.
        self.probations: dict[str, tuple[Candidate, Verdict]] = {}
        self._below_floor: dict[str, bool] = {}  # model name -> below its floor at the last read (logged on change)
        # The deployment's reload count as this worker last acted on it (None until first read): a reload
        # asked of another host reaches this one through the store.
        self.reloads_seen: int | None = None

    def begin(self) -> None:
        """Start reading arrivals from now: lists served from here on are scored by events from here on;
        and count reloads from now (what the start loads is the newest already)."""
        if self.state is None:
            return
        if self.lists is not None:
            try:
                self.cursor, _ = self.state.arrivals(None)
            except StoreError as exc:
                log.warning("online evaluation starts when the store is back: %s", exc)
        try:
            self.reloads_seen = self.state.reloads()
        except StoreError as exc:
            log.warning("reloads asked of other hosts are followed once the store is back: %s", exc)

    def ask_reload(self) -> None:
        """A reload asked of this host (POST /admin/reload): counted in the store, so that every other host
        reloads on its next tick; this one reloads now and has seen it."""
        if self.state is None:
            return
        try:
            self.reloads_seen = self.state.add_reload()
        except StoreError as exc:
            log.warning("reload not shared with the other hosts (the store is away): %s", exc)

    def reload_asked(self) -> bool:
        """Whether another host was asked for a reload since this worker last looked."""
        if self.state is None:
            return False
        try:
            count = self.state.reloads()
        except StoreError:
            return False
        seen, self.reloads_seen = self.reloads_seen, count
        if seen is None or count <= seen:
            return False
        log.info("reload asked of another host (reloads %d, last acted on %d): reloading", count, seen)
        return True

    async def score(self) -> None:
        """Score the lists this worker holds against the arrivals since its cursor (every
        SEQSERVE_ONLINE_SCORE_S). The store is read in a thread; the lists are touched on the event loop
        only, where requests record them."""
        if self.state is None or self.lists is None:
            return
        started = time.time()
        try:
            if self.cursor is None:
                self.cursor, _ = await asyncio.to_thread(self.state.arrivals, None)
            while True:
                self.cursor, arrivals = await asyncio.to_thread(self.state.arrivals, self.cursor, 2_000)
                if not arrivals:
                    break
                for served, scored, segment in self.lists.score(arrivals, segment=self.segment):
                    self.metrics.observe_online(served.model, served.version, served.variant, scored, segment=segment)
            # What was stored a second before this pass began has been read (a margin for the commit and
            # for hosts' clocks): lists older than that can be superseded on sight (ServedLists.record).
            self.lists.settled_before = started - SETTLE_MARGIN_S
        except StoreError as exc:
            log.warning("online evaluation paused: %s", exc)

    async def share(self) -> None:
        """Every housekeeping tick: expire lists, add this worker's sums to the store's, read the shared
        figures back, and judge the candidates."""
        if self.state is None:
            return
        if self.lists is not None:
            self.lists.expire()
            tally = self.lists.take()
            self.metrics.count_unscored(superseded=tally.superseded, expired=tally.expired, evicted=tally.evicted)
            self.metrics.count_credits(tally.credits)
            for key, sums in tally.sums.items():
                self._unsent.setdefault(key, Sums()).add(sums)
            for ukey, pair in tally.users.items():
                got = self._unsent_users.setdefault(ukey, [0.0, 0.0])
                got[0] += pair[0]
                got[1] += pair[1]
            # Off the loop: a version's popular head is counted from its table at first use.
            engines = {(m, v): self._engine(m, v) for m, v in {(e[0], e[1]) for e in tally.shown}}
            lists_shown = tally.shown
            exposure = await asyncio.to_thread(
                lambda: exposure_of(lists_shown, {k: e.head_items for k, e in engines.items() if e is not None})
            )
            self.metrics.count_exposure(exposure)
            bucket = math.floor(time.time() / EXPOSURE_BUCKET_S) * EXPOSURE_BUCKET_S
            self._sent_items = {k: v for k, v in self._sent_items.items() if k[3] == bucket}
            for (model, version, variant), e in exposure.items():
                ekey = (model, version, variant, bucket)
                e.items -= self._sent_items.get(ekey, set())
                self._unsent_exposure.setdefault(ekey, Exposure()).add(e)
        if self.traffic is not None:
            for tkey, t in self.traffic.take().items():
                self._unsent_traffic.setdefault(tkey, Traffic()).add(t)
        state, names = self.state, self.loaded.names
        try:
            await asyncio.to_thread(partial(state.expire, now=time.time()))
            if self._unsent_traffic:
                await asyncio.to_thread(state.add_traffic, self._unsent_traffic)
                self._unsent_traffic = {}
            if self._unsent:
                await asyncio.to_thread(state.add_online, self._unsent)
                self._unsent = {}  # only once taken: while the store is away they wait for the next tick
            if self._unsent_users:
                await asyncio.to_thread(state.add_user_sums, self._unsent_users)
                self._unsent_users = {}
            if self._unsent_exposure:
                await asyncio.to_thread(state.add_exposure, self._unsent_exposure)
                for ekey, e in self._unsent_exposure.items():  # older buckets' go at the next tick
                    self._sent_items.setdefault(ekey, set()).update(e.items)
                self._unsent_exposure = {}
            self.online = await asyncio.to_thread(lambda: {name: state.online(name) for name in names})
        except StoreError as exc:
            log.warning("online figures not shared: %s", exc)
            return
        await self.judge()
        await self.watch()
        if time.time() - self._coverage_read >= COVERAGE_READ_S:
            self._coverage_read = time.time()
            self.floors()
            for name in names:
                shown = await self.exposure(name, since=time.time() - self.policy.online_window_s)
                self.metrics.set_coverage(name, {key: f.coverage for key, f in shown.items()})

    async def exposure(self, name: str, *, since: float) -> dict[tuple[str, str], ExposureFigures]:
        """(version, variant) -> what it showed of model `name` since `since`, every worker and host together
        ({} without a store, or while it is away)."""
        if self.state is None:
            return {}
        try:
            found = await asyncio.to_thread(partial(self.state.exposure, name, since=since))
        except StoreError as exc:
            log.warning("exposure not read: %s", exc)
            return {}
        return {key: ExposureFigures.of(e, self._catalog_size(name, key[0])) for key, e in found.items()}

    def _engine(self, name: str, version: str) -> UserHistories[Any, Any] | None:
        """The engine of `version` of model `name` when it is loaded here (live or candidate)."""
        for served in (self.loaded.models.get(name), self.loaded.candidate_models.get(name)):
            if served is not None and served.version == version and isinstance(served.engine, UserHistories):
                return served.engine
        return None

    def segment(self, served: ServedList, user: str) -> str:
        """A scored list's segment, told by the version that served it ("" once it is not loaded here)."""
        engine = self._engine(served.model, served.version)
        if engine is None:
            return ""
        fresh = engine.fresh_items
        return segment_of(
            known_user=engine.has_history(user),
            fresh=bool(fresh) and not fresh.isdisjoint(served.items),
            fallback=served.fallback,
        )

    def _catalog_size(self, name: str, version: str) -> int:
        """The catalog of `version` of model `name` when it is loaded here, else the live version's."""
        engine = self._engine(name, version)
        live = self.loaded.models.get(name)
        if engine is None and live is not None:
            engine = self._engine(name, live.version)
        return engine.catalog_size if engine is not None else 0

    async def judge(self) -> None:
        """The promotion rule (SEQSERVE_PROMOTE_MIN_LISTS; 0: off) on each candidate, from the shared figures;
        what it reads is kept in `trials` either way (GET /models/{name}/online shows it)."""
        need = self.policy.promote_min_lists
        if self.state is None:
            return
        self.trials = {n: t for n, t in self.trials.items() if n in self.choices.candidates}
        for name, cand in list(self.choices.candidates.items()):
            live = self.loaded.models.get(name)
            if live is None or cand.version == live.version:
                continue
            state = self.state
            try:
                sides = await asyncio.to_thread(state.trial_stats, name, cand.since)
            except StoreError as exc:
                log.warning("the promotion rule waits for the store: %s", exc)
                return
            found = verdict(cand, live.version, sides, min_events=need, margin=self.policy.promote_margin)
            self.trials[name] = (cand, found)
            if need and found.action != "wait":
                await self.settle(name, cand.version, promote=found.action == "promote", reason=f"rule: {found.reason}")

    async def watch(self) -> None:
        """Probation (SEQSERVE_PROBATION_S): each promotion is watched until it is confirmed or rolled back
        (app.promotion.probation: anytime-valid tests of its online NDCG@10 against its holdback's and its own
        reference lists', read only with SEQSERVE_EVENTS_API_KEY set, as for the rule; its answers against the
        holdback's); what it reads is kept in `probations` either way (GET /models/{name}/online shows it)."""
        s = self.policy.probation
        if not s.probation_s or self.state is None:
            return
        now = time.time()
        self.probations = {n: p for n, p in self.probations.items() if n in self.choices.last}
        for name, cand in list(self.choices.last.items()):
            ended = self.choices.on_probation(name, cand.version)
            if ended is None or cand.replaced is None:
                self.probations.pop(name, None)
                continue
            state = self.state
            try:
                traffic = await asyncio.to_thread(partial(state.traffic, name, since=ended - MINUTE_S))
                # The lists since the promotion, per user: the live version's, its floor's and the holdback's
                # (app.trials keeps them under the promotion's time).
                stats = await asyncio.to_thread(state.trial_stats, name, ended)
            except StoreError as exc:
                log.warning("probation waits for the store: %s", exc)
                return
            sides = probation_sides(
                cand,
                stats,
                traffic,
                scored=self.policy.scored and self._engine(name, cand.version) is not None,
                held=self.choices.holdback_share > 0,
            )
            found = probation(cand, sides, now=now, settings=s)
            self.probations[name] = (cand, found)
            if found.action == "roll_back" and await asyncio.to_thread(state.roll_back, name, cand.version):
                log.error(
                    "version %s/%s rolled back to %s (probation: %s)", name, cand.version, cand.replaced, found.reason
                )
                self.metrics.count_trial_change(name, "rolled_back")
            elif found.action == "confirm" and await asyncio.to_thread(state.confirm, name, cand.version):
                log.warning("version %s/%s confirmed (probation: %s)", name, cand.version, found.reason)
                self.metrics.count_trial_change(name, "confirmed")

    def floors(self) -> None:
        """Each live version's online NDCG@10 against its floor (its reference lists on the same events) over
        the online window, lists as the unit, on the gauges an alert rule reads: after probation, nothing
        rolls a version back by itself, so a version below its floor must page someone."""
        since = time.time() - self.policy.online_window_s
        for name, served in self.loaded.models.items():
            live, floor = live_and_floor(self.online.get(name, {}), served.version, since=since)
            if min(live.n, floor.n) < self.policy.probation.probation_min_lists:
                self.metrics.set_floor(name, None)
                continue
            drop, half = sagged(floor, live)
            below = drop > half
            if below and not self._below_floor.get(name, False):
                log.error(
                    "version %s/%s below its floor: online NDCG@10 %.4f against %.4f of its reference lists on the"
                    " same %d lists over the last %.0f s (interval half-width %.4f, lists as the unit)",
                    name,
                    served.version,
                    live.mean,
                    floor.mean,
                    int(live.n),
                    self.policy.online_window_s,
                    half,
                )
            self._below_floor[name] = below
            self.metrics.set_floor(name, (live.mean - floor.mean, below))

    async def settle(self, name: str, version: str, *, promote: bool, reason: str) -> bool:
        """Promote (pin) or retire the candidate `version` of `name`; False when it no longer was the candidate."""
        assert self.state is not None
        done = await asyncio.to_thread(self.state.settle, name, version, promote=promote)
        if done:
            action = "promoted" if promote else "retired"
            log.warning("candidate %s/%s %s (%s)", name, version, action, reason)
            self.metrics.count_trial_change(name, action)
        return done

    async def start(self, name: str, candidate: Candidate, *, live_version: str | None, reason: str) -> None:
        """Make `candidate` the trial of `name`, pinning the live version so it keeps serving the rest. A new
        trial replaces the name's record, so a promotion still on probation is confirmed first: the one who starts
        a trial against it (an admin call) has decided."""
        assert self.state is not None
        last = self.choices.last.get(name)
        on_probation = last is not None and self.choices.on_probation(name, last.version) is not None
        if last is not None and on_probation and await asyncio.to_thread(self.state.confirm, name, last.version):
            log.warning("version %s/%s confirmed (probation ended by a new trial: %s)", name, last.version, reason)
            self.metrics.count_trial_change(name, "confirmed")
        if live_version is not None and self.choices.pins.get(name) != live_version:
            await asyncio.to_thread(self.state.set_pin, name, live_version)
        await asyncio.to_thread(self.state.set_candidate, name, candidate)
        log.warning("candidate %s/%s started as %s (%s)", name, candidate.version, candidate.mode, reason)
        self.metrics.count_trial_change(name, "started")

    async def adopt_new_versions(self, root: Path) -> None:
        """SEQSERVE_NEW_VERSIONS=canary|shadow: the newest version, when newer than the live one and
        published after the last trial began (so neither a retired version nor one an admin passed
        over comes back), becomes the candidate instead of replacing the live one; while a promotion's
        holdback runs it waits for the next reload after it."""
        mode = self.policy.new_versions
        if mode == "serve" or self.state is None:
            return
        for name, folders in (await asyncio.to_thread(artifact_names, root)).items():
            live = self.loaded.models.get(name)
            if live is None or not folders or live.folder not in folders:
                continue
            newest = folders[0]
            last = self.choices.last.get(name)
            if self.choices.on_probation(name, live.version) is not None:  # a trial would end it undecided
                log.info("new version %s/%s waits: probation of %s runs", name, newest.name, live.version)
                continue
            if folders.index(live.folder) == 0 or f"{name}/{newest.name}" in self.loaded.broken:
                continue
            if last is not None and version_time(newest.name) <= last.since:  # there when the last trial began
                continue
            if await asyncio.to_thread(self.loaded.verify, name, newest) is not None:
                log.error("new version %s/%s does not load: not started as %s", name, newest.name, mode)
                self.metrics.count_trial_change(name, "refused_broken")
                continue  # recorded broken: not tried again
            cand = Candidate(newest.name, mode, self.policy.canary_share if mode == "canary" else 1.0, time.time())
            await self.start(name, cand, live_version=live.version, reason="new version")
            self.choices.pins[name] = live.version
            self.choices.candidates[name] = self.choices.last[name] = cand

    @property
    def choices(self) -> VersionChoices:
        """The pins and candidates as this worker last read them: this loop writes them, the models read them."""
        return self.loaded.choices

    def _read_stored(self) -> tuple[dict[str, str], dict[str, Candidate]]:
        """The pins and the candidates the production state holds (StoreError when it cannot be read): the
        one reader of them, which every path that takes them comes through."""
        assert self.state is not None
        return self.state.pins(), self.state.candidates()

    def stored_choices(self) -> tuple[dict[str, str], dict[str, Candidate]] | None:
        """The stored pins and candidates; None while they cannot be read (what serves stays)."""
        if self.state is None:
            return None
        try:
            return self._read_stored()
        except (StoreError, ValueError) as exc:
            log.debug("version choices not read: %s", exc)
            return None

    async def tick(self, artifacts: Path, coordinator: Coordinator | None) -> None:
        """Every housekeeping tick: the stored pins and candidates are read first, so a reload another worker
        was asked for serves them, and those set through another host (a shared Redis) or by the promotion
        rule reach this worker too; then the online figures are shared and the rule judges."""
        asked = await asyncio.to_thread(self.reload_asked)
        changed = await self.follow_choices()
        followed = coordinator is not None and await coordinator.follow()
        if (changed or asked) and not followed:
            await self.loaded.reload(artifacts)
            if coordinator is not None:
                coordinator.announce()
        await self.share()

    async def scoring(self) -> None:
        """Every SEQSERVE_ONLINE_SCORE_S, for good: score the lists served against the events stored since
        (quicker than housekeeping, so a user's quick succession of answers and events is scored before
        the per-user bound drops any)."""
        while True:
            await asyncio.sleep(self.policy.online_score_s)
            try:
                await self.score()
            except Exception:  # never ends the loop
                log.exception("online scoring failed; trying again")

    async def follow_choices(self) -> bool:
        """Take the stored pins and candidates; -> whether what should serve changed (False while they
        cannot be read)."""
        stored = await asyncio.to_thread(self.stored_choices)
        return stored is not None and self.choices.take(*stored)

    async def read_choices(self) -> bool:
        """Take the stored pins and candidates now, for an admin call that must act on them (StoreError
        when they cannot be read)."""
        return self.choices.take(*await asyncio.to_thread(self._read_stored))

    async def pin(self, name: str, version: str | None) -> None:
        """Pin `name` to `version` (None: unpin) in the production state, then take the stored pins."""
        assert self.state is not None
        await asyncio.to_thread(self.state.set_pin, name, version)
        await self.read_choices()
