"""Next-location prediction (MHSA): the artifact, the query types and the served engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from models import artifact
from models.engine import Engine, EngineOptions
from models.features import BUCKETING
from models.ids import N_SPECIAL, PAD, UNK, IdMap
from models.manifest import Manifest
from models.mhsa import MHSA
from models.queries import QueryError, Timeline
from models.staypoints import StayBatch, collate_staypoints
from models.traced import example_rows, serving_scores


@dataclass
class LocArtifact:
    folder: Path
    manifest: Manifest
    model: MHSA
    locations: IdMap
    users: IdMap


def load_artifact(folder: Path, map_location: str | torch.device = "cpu") -> LocArtifact:
    """Load and cross-check a next-location artifact; raises ArtifactError on any defect."""
    manifest = artifact.read_manifest(folder)
    # Features computed differently from how the model was trained would be silently wrong.
    artifact.check(
        manifest.extra.get("bucketing") == BUCKETING,
        artifact.MANIFEST,
        f"bucketing {manifest.extra.get('bucketing')} differs from this code's {BUCKETING}",
    )
    model: MHSA = artifact.read_model(folder, manifest, MHSA, map_location)
    locations, users = artifact.read_id_map(folder, artifact.LOCATIONS), artifact.read_id_map(folder, artifact.USERS)
    artifact.check(
        model.config.n_locations == len(locations) and model.config.n_users == len(users),
        artifact.LOCATIONS,
        f"model vocabularies do not match {artifact.LOCATIONS}/{artifact.USERS}",
    )
    return LocArtifact(folder, manifest, model, locations, users)


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


class LocEngine(Engine[LocQuery, LocPrepared, LocResult]):
    """A next-location artifact placed on a device, answering batches of queries."""

    def __init__(self, art: LocArtifact, options: EngineOptions) -> None:
        self.art = art
        self.manifest = art.manifest
        self.device = options.device
        self.model = (art.model.half() if options.half else art.model).to(self.device).eval()
        self.scores, self.scoring = serving_scores(self.model, self._examples, enabled=options.trace)

    def _examples(self) -> list[StayBatch]:
        c = self.model.config
        # Histories of up to 64 steps: checking the full 512 took 6.4 s at load, and a trace fixes no
        # length (tests/models/test_traced.py checks lengths it never saw).
        rows = example_rows(N_SPECIAL, c.n_locations, max_len=min(c.max_len, 64))
        # A place every 97 minutes of the week, staying 0-299 minutes: the batches span every bucket.
        return [
            collate_staypoints(
                [[(x, 97 * i % 1440, i % 7, 37 * i % 300) for i, x in enumerate(r)] for r in batch],
                [n % c.n_users for n in range(len(batch))],
                max_len=c.max_len,
            ).to(self.device)
            for batch in rows
        ]

    @property
    def catalog_size(self) -> int:
        return self.art.locations.n_entities

    def prepare(self, queries: Sequence[LocQuery], live: Mapping[str, Timeline]) -> list[LocPrepared]:
        """Map raw ids to indices. Cheap: no model call."""
        out = []
        for n, q in enumerate(queries):
            if not q.history:
                raise QueryError("a history needs at least one staypoint", position=n, field=("history",))
            if q.k < 1:
                raise QueryError("k must be at least 1", position=n, field=("k",))
            locs = self.art.locations.indices([s.location_id for s in q.history])
            user = self.art.users.index(q.user_id) if q.user_id is not None else UNK
            out.append(
                LocPrepared(
                    query=q,
                    steps=[(li, s.start_min, s.weekday, s.duration_min) for li, s in zip(locs, q.history, strict=True)],
                    # An unknown user gets no user-embedding contribution: index 0 is the zero embedding.
                    user=PAD if user == UNK else user,
                    unknown=list(
                        dict.fromkeys(s.location_id for s, li in zip(q.history, locs, strict=True) if li == UNK)
                    ),
                )
            )
        return out

    def run(self, batch: list[LocPrepared]) -> torch.return_types.topk:
        """All prepared queries go through one forward pass."""
        tensors = collate_staypoints(
            [p.steps for p in batch], [p.user for p in batch], max_len=self.model.config.max_len
        )
        k = min(max(p.query.k for p in batch), self.catalog_size + 1)
        return self.scores(tensors.to(self.device)).topk(k, dim=1)

    def results(self, batch: list[LocPrepared], output: torch.return_types.topk) -> list[LocResult]:
        probs, idx = output.values.float().exp().cpu().tolist(), output.indices.cpu().tolist()
        raw = self.art.locations.raw
        max_len = self.model.config.max_len
        out = []
        for row, p in enumerate(batch):
            kq = p.query.k
            ranked = [(None if i == UNK else raw(i), pr) for i, pr in zip(idx[row][:kq], probs[row][:kq], strict=True)]
            out.append(LocResult(ranked, p.unknown, p.user == PAD, len(p.steps) > max_len))
        return out

    def warm_up(self) -> None:
        self.answer([LocQuery(None, [LocStep(self.art.locations.raw(N_SPECIAL) or "", 0, 0, 0)])])
