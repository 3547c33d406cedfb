"""Warm starts: a new model's weights from a trained one whose id map differs (items first seen live).

Every tensor whose first dimension runs over an id map (item embeddings, output biases, a [MASK]
row past the items; a social model's user and action tables) is carried row by row through the raw
ids both versions of that map hold; rows of ids the old model never saw keep the new model's
initialisation. Tensors of the same shape otherwise (attention, feed-forward, norms, positions) are
copied whole. Integer buffers (a transition table) are refitted by training from the new data, never
carried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from models.ids import N_SPECIAL, IdMap


@dataclass(frozen=True)
class Carried:
    tensors: int  # copied or carried row by row
    fresh: list[str]  # tensors left at their initialisation (no counterpart of a usable shape)
    ids_kept: int  # ids of the new map the old model knew
    ids_new: int  # ids first seen in the new data


def row_sources(old: IdMap, new: IdMap) -> torch.Tensor:
    """For each index of `new`: the index of the same raw id in `old`, the specials themselves, or -1."""
    src = torch.full((len(new),), -1, dtype=torch.long)
    src[:N_SPECIAL] = torch.arange(N_SPECIAL)
    for index, raw in enumerate(new.raws(), start=N_SPECIAL):
        if raw in old:
            src[index] = old.index(raw)
    return src


@dataclass(frozen=True)
class Remap:
    """One id map of a model, as the old version had it and as the new data has it."""

    old: IdMap
    new: IdMap

    def rows(self, extra: int) -> tuple[int, int]:
        """The first-dimension sizes of a tensor over this map with `extra` rows past the ids: (old, new)."""
        return len(self.old) + extra, len(self.new) + extra


@torch.no_grad()
def carry_over(
    model: nn.Module, old_state: dict[str, torch.Tensor], old_ids: IdMap, new_ids: IdMap, *more: Remap
) -> Carried:
    """Load what of `old_state` fits `model` (whose id map is `new_ids`; `more` maps of other ids), in
    place. A tensor is carried row by row through the map whose old and new sizes its first dimension
    has (with at most one row past the ids); one that two maps would fit stays fresh (no guess)."""
    maps = [Remap(old_ids, new_ids), *more]
    sources = [row_sources(m.old, m.new) for m in maps]
    carried, fresh = 0, []
    for name, tensor in model.state_dict().items():
        old = old_state.get(name)
        if old is None or not tensor.is_floating_point():
            if old is None:
                fresh.append(name)
            continue
        fits = [
            (m, src, extra)
            for m, src in zip(maps, sources, strict=True)
            for extra in (0, 1)
            if tensor.dim() and m.rows(extra) == (old.shape[0], tensor.shape[0]) and old.shape[1:] == tensor.shape[1:]
        ]
        if len(fits) == 1:
            m, src, extra = fits[0]
            known, n_new = src >= 0, len(m.new)
            target = tensor[:n_new]
            target[known] = old[src[known]].to(tensor.dtype)
            if extra:  # rows past the ids ([MASK]) follow the ids
                tensor[n_new:] = old[len(m.old) :].to(tensor.dtype)
        elif not fits and old.shape == tensor.shape:
            tensor.copy_(old)
        else:
            fresh.append(name)
            continue
        carried += 1
    n_kept = int((sources[0] >= 0)[N_SPECIAL:].sum())
    return Carried(carried, fresh, n_kept, len(new_ids) - N_SPECIAL - n_kept)


# The run config's warm-start record lists the raw ids the version's warm retrains added to its map, its
# parents' included: serving measures the lists that hold one of them apart (items first seen live).
FIRST_SEEN_LIVE = "items_first_seen_live"


def first_seen_live(run_config: dict[str, Any]) -> list[str]:
    """The raw ids a version knows only because a warm retrain met them in live events ([] for a version
    trained from its data set alone, or written before the record)."""
    warm = run_config.get("warm_start")
    got = warm.get(FIRST_SEEN_LIVE) if isinstance(warm, dict) else None
    return [str(r) for r in got] if isinstance(got, list) else []


def added_live(parent_config: dict[str, Any], old_ids: IdMap, new_ids: IdMap) -> list[str]:
    """What a warm retrain records: the parent's items first seen live that the new map still holds, and
    the ids the new map adds to the parent's, sorted."""
    kept = {r for r in first_seen_live(parent_config) if r in new_ids}
    return sorted(kept | {r for r in new_ids.raws() if r not in old_ids})
