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
class LocPrepared:
    query: LocQuery
    steps: list[tuple[int, int, int, int]]
    user: int
    unknown: list[str]


@dataclass
class LocResult:
    locations: list[tuple[str | None, float]]  # None = a place not seen in training
    unknown_locations: list[str]
    unknown_user: bool
    truncated: bool


class Locator:
    """A next-location artifact placed on a device, answering batches of queries."""

    def __init__(self, art: LocArtifact, device: torch.device, half: bool = False) -> None:
        self.art = art
        self.device = device
        self.model = (art.model.half() if half else art.model).to(device).eval()

    @property
    def catalog_size(self) -> int:
        return self.art.locations.n_entities

    def prepare(self, queries: list[LocQuery]) -> list[LocPrepared]:
        """Map raw ids to indices. Cheap: no model call."""
        out = []
        for q in queries:
            locs = self.art.locations.indices([s.location_id for s in q.history])
            user = self.art.users.index(q.user_id) if q.user_id is not None else UNK
            out.append(
                LocPrepared(
                    query=q,
                    steps=[(li, s.start_min, s.weekday, s.duration_min) for li, s in zip(locs, q.history, strict=True)],
                    # An unknown user gets no user-embedding contribution: index 0 is the zero embedding.
                    user=PAD if user == UNK else user,
                    unknown=list(dict.fromkeys(s.location_id for s, li in zip(q.history, locs, strict=True)
                                               if li == UNK)),
                )
            )
        return out

    def predict(self, queries: list[LocQuery]) -> list[LocResult]:
        return self.infer(self.prepare(queries))

    def infer(self, batch: list[LocPrepared]) -> list[LocResult]:
        """All prepared queries go through one forward pass."""
        max_len = self.model.config.max_len
        tensors = collate_staypoints([p.steps for p in batch], [p.user for p in batch], max_len=max_len)
        k = min(max(p.query.k for p in batch), self.catalog_size + 1)
        with torch.inference_mode():
            top = self.model.scores(tensors.to(self.device)).topk(k, dim=1)
        probs, idx = top.values.exp().cpu().tolist(), top.indices.cpu().tolist()
        out = []
        raw = self.art.locations.raw
        for row, p in enumerate(batch):
            kq = p.query.k
            ranked = [(None if i == UNK else raw(i), pr) for i, pr in zip(idx[row][:kq], probs[row][:kq], strict=True)]
            out.append(LocResult(ranked, p.unknown, p.user == PAD, len(p.steps) > max_len))
        return out
