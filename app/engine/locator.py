"""Raw staypoint queries -> one forward pass -> next-location probabilities with raw ids."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.artifact import LocArtifact
from models.ids import PAD, UNK
from models.mhsa import collate_staypoints


@dataclass
class LocStep:
    location_id: str
    start_min: int  # minute of the day, 0..1439
    weekday: int  # 0 = Monday
    duration_min: int


@dataclass
class LocQuery:
    user_id: str | None
    history: list[LocStep]  # oldest first, at least one
    k: int = 5


@dataclass
class LocResult:
    locations: list[tuple[str | None, float]]  # None = a place not seen in training
    unknown_locations: list[str]
    unknown_user: bool
    truncated: bool


class Locator:
    """A next-location artifact placed on a device, answering batches of queries."""

    def __init__(self, art: LocArtifact, device: torch.device) -> None:
        self.art = art
        self.device = device
        self.model = art.model.to(device).eval()

    @property
    def catalog_size(self) -> int:
        return self.art.locations.n_entities

    def predict(self, queries: list[LocQuery]) -> list[LocResult]:
        """All queries go through one forward pass."""
        max_len = self.model.config.max_len
        locs = [self.art.locations.indices([s.location_id for s in q.history]) for q in queries]
        users = [self.art.users.index(q.user_id) if q.user_id is not None else UNK for q in queries]
        # An unknown user gets no user-embedding contribution: index 0 is the zero embedding.
        users = [PAD if u == UNK else u for u in users]
        steps = [
            [(li, s.start_min, s.weekday, s.duration_min) for li, s in zip(ls, q.history, strict=True)]
            for ls, q in zip(locs, queries, strict=True)
        ]
        batch = collate_staypoints(steps, users, max_len=max_len).to(self.device)
        k = min(max(q.k for q in queries), self.catalog_size + 1)
        with torch.inference_mode():
            logp = self.model.scores(batch)
            top = logp.topk(k, dim=1)
        probs, idx = top.values.exp().cpu().tolist(), top.indices.cpu().tolist()
        out = []
        for row, q in enumerate(queries):
            ranked = [
                (None if i == UNK else self.art.locations.raw(i), p) for i, p in zip(idx[row][: q.k], probs[row][: q.k],
                                                                                   strict=True)
            ]
            unknown = [s.location_id for s, li in zip(q.history, locs[row], strict=True) if li == UNK]
            out.append(LocResult(ranked, list(dict.fromkeys(unknown)), users[row] == PAD, len(q.history) > max_len))
        return out
