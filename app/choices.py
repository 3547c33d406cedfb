"""Which version of each model should serve, and which is on trial beside it: the production state's
pins and candidates as this worker last read them.

One writer, the production loop (app/production/loop.py): it reads them from the store, and changes them
only through the store (an admin pin, a started or settled trial) before taking them back. The loaded
models (app/loaded.py) and the routers read them. A trial is a candidate's run beside the live version,
from its `since` until its outcome. While probation watches a promotion and no trial runs, the version
it replaced answers a share of the users (the holdback), so the promoted version is compared with it over
the same time (docs/decisions/online-evaluation.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from app.store import Candidate


@dataclass(frozen=True)
class Holdback:
    """The version a promotion replaced, answering `share` of the users (app.production.trials.in_holdback)
    while probation watches the promotion and no trial runs; derived from the promoted candidate, never
    stored. `since`: the promotion's time (its lists are compared with the new version's from then on)."""

    version: str
    share: float
    since: float

    @property
    def variant(self) -> Literal["holdback"]:
        """The online side its lists are scored as."""
        return "holdback"


# What serves beside the live version of a model: a trial's candidate, or a promotion's holdback.
Beside = Candidate | Holdback


@dataclass
class VersionChoices:
    pins: dict[str, str] = field(default_factory=dict)  # model name -> the version pinned
    candidates: dict[str, Candidate] = field(default_factory=dict)  # model name -> its running trial's candidate
    # Model name -> its last candidate, running or ended: an ended trial's version is not tried again.
    last: dict[str, Candidate] = field(default_factory=dict)
    # Model name -> the version its promotion replaced, as a "holdback" beside it while probation watches
    # the promotion and no trial runs (derived from `last`, never stored).
    holdbacks: dict[str, Holdback] = field(default_factory=dict)
    probation: bool = False  # SEQSERVE_PROBATION_S above 0: a promotion is watched until kept or rolled back
    holdback_share: float = 0.0  # SEQSERVE_PROBATION_HOLDBACK: 0, no holdback

    def take(self, pins: dict[str, str], last: dict[str, Candidate]) -> bool:
        """The store's pins and candidates; -> whether what should serve changed (a holdback also ends with
        its promotion's probation)."""
        before = (self.pins, self.candidates, self.holdbacks)
        self.pins, self.last = pins, last
        self.candidates = {n: c for n, c in last.items() if c.running}
        self.holdbacks = {
            name: Holdback(c.replaced, self.holdback_share, ended)
            for name, c in last.items()
            if self.holdback_share > 0
            and c.replaced is not None
            and name not in self.candidates
            and (ended := self.on_probation(name, c.version)) is not None
        }
        return before != (self.pins, self.candidates, self.holdbacks)

    def beside(self, name: str) -> Beside | None:
        """The version served beside the live one of `name`: its running trial's candidate, else its holdback."""
        return self.candidates.get(name) or self.holdbacks.get(name)

    def on_probation(self, name: str, version: str) -> float | None:
        """When `version` of `name` was promoted, while that promotion is on probation (neither confirmed nor
        rolled back, and the version still pinned): its live lists are then kept per user from that time."""
        last = self.last.get(name)
        if not self.probation or last is None or last.version != version or not last.on_probation:
            return None
        if last.ended is None or self.pins.get(name) != version:
            return None
        return last.ended
