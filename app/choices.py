"""Which version of each model should serve, and which is on trial beside it: the production state's
pins and candidates as this worker last read them.

One writer, the production loop (app/production.py): it reads them from the store, and changes them
only through the store (an admin pin, a started or settled trial) before taking them back. The loaded
models (app/loaded.py) and the routers read them. A trial is a candidate's run beside the live version,
from its `since` until its outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.store import Candidate


@dataclass
class VersionChoices:
    pins: dict[str, str] = field(default_factory=dict)  # model name -> the version pinned
    candidates: dict[str, Candidate] = field(default_factory=dict)  # model name -> its running trial's candidate
    # Model name -> its last candidate, running or ended: an ended trial's version is not tried again.
    last: dict[str, Candidate] = field(default_factory=dict)

    def take(self, pins: dict[str, str], last: dict[str, Candidate]) -> bool:
        """The store's pins and candidates; -> whether what should serve changed."""
        running = {n: c for n, c in last.items() if c.running}
        changed = pins != self.pins or running != self.candidates
        self.pins, self.candidates, self.last = pins, running, last
        return changed

    def probation(self, name: str, version: str, *, now: float, span_s: float) -> float | None:
        """When `version` of `name` was promoted, while that promotion is on probation (within `span_s`
        of it, and the version still pinned): its live lists are then kept per user from that time."""
        last = self.last.get(name)
        if last is None or last.outcome != "promoted" or last.version != version or last.ended is None:
            return None
        if now - last.ended > span_s or self.pins.get(name) != version:
            return None
        return last.ended
