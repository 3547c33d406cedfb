"""The artifact's history table written by rank 0 from every rank's users, in rounds: no rank holds
more than its own users' steps and one round of the others' (docs/decisions/rank-shares.md).

Each rank orders its users by hash, as the table's rows are, and sends rank 0 a few bytes a user
(hash, length, id); rank 0 merges the orders and writes the per-user columns. The step columns follow
in rounds of about ROUND_STEPS steps of the table: every rank sends its steps of the round's rows
(a run of its own ordered users), and rank 0 interleaves them into the table's order and appends
them to the file. One process (`ONE_PROCESS`) takes the same path with itself as the only rank.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from models.history_table import check_rows, hash_order, open_column, step_positions, write_extra_ids, write_values
from training.distributed import ONE_PROCESS, Dist

ROUND_STEPS = 4_000_000  # steps of the table a round: rank 0 holds about this many of each step column


@dataclass
class HistoryShares:
    """This rank's users' steps (indices of the job's map) for the artifact's table."""

    users: Sequence[str]
    ends: np.ndarray  # int64 (U,): user u's steps end here (CSR)
    items: np.ndarray  # int32 (N,)
    times: np.ndarray  # float64 (N,)
    item_offset: int = 0  # added to each item as it is written (the map's special indices)
    dist: Dist = field(default=ONE_PROCESS)

    def write(self, folder: Path) -> None:
        """Rank 0: the table into `folder` (created), from every rank's share."""
        assert self.dist.is_main
        folder.mkdir(parents=True, exist_ok=True)
        self._exchange(folder)

    def send(self) -> None:
        """Every other rank, while rank 0 writes: its share, round by round."""
        assert not self.dist.is_main
        self._exchange(None)

    def _exchange(self, folder: Path | None) -> None:
        dist = self.dist
        lengths = np.diff(self.ends, prepend=0).astype(np.int64)
        check_rows(self.users, lengths, items=self.items, times=self.times)
        hashes, order = hash_order(self.users)
        starts = self.ends - lengths
        encoded = [self.users[i].encode() for i in order.tolist()]
        key_lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        keys = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        del encoded
        # Every rank's users in its own order on rank 0: torch has no unsigned 64-bit gather, so the hashes
        # travel as their int64 bits.
        sent = {
            name: dist.gather(torch.from_numpy(col))
            for name, col in (
                ("hashes", hashes.view(np.int64)),
                ("lengths", lengths[order]),
                ("key_lengths", key_lengths),
                ("keys", keys.copy()),
            )
        }
        merged = _merge(folder, **sent) if folder is not None else None
        # Where each round ends, counted in each rank's own ordered users: (rounds + 1, world), rank 0's.
        n_rounds = dist.from_main(0.0 if merged is None else len(merged.bounds) - 1)[0]
        shape = int(n_rounds + 1) * dist.world
        flat = dist.from_main(*(merged.bounds.ravel().tolist() if merged is not None else [0.0] * shape))
        bounds = np.asarray(flat, dtype=np.int64).reshape(-1, dist.world)[:, dist.rank]
        for name, column, offset in (("items", self.items, self.item_offset), ("times", self.times, 0)):
            out = open_column(merged.folder, name, merged.steps) if merged is not None else None
            try:
                for i, (a, b) in enumerate(itertools.pairwise(bounds)):
                    mine = column[step_positions(starts, lengths, order[a:b])]
                    parts = dist.gather(torch.from_numpy(mine + offset if offset else mine))
                    if out is not None and merged is not None:
                        write_values(out, name, merged.interleave(parts, i))
            finally:
                if out is not None:
                    out.close()
        if folder is not None:
            write_extra_ids(folder, [])


@dataclass
class _Merged:
    """Rank 0's view of the table's rows: which rank holds each row and how long it is, in table order."""

    folder: Path
    rank: np.ndarray  # int64 (U,)
    lengths: np.ndarray  # int64 (U,)
    rows: np.ndarray  # int64 (rounds + 1,): the table's rows where each round starts
    bounds: np.ndarray  # int64 (rounds + 1, world): the same, counted in each rank's own rows
    steps: int

    def interleave(self, parts: list[torch.Tensor], i: int) -> np.ndarray:
        """Round `i`'s steps in the table's order, from each rank's run of them."""
        lo, hi = self.rows[i], self.rows[i + 1]
        rank, lengths = self.rank[lo:hi], self.lengths[lo:hi]
        sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        starts = np.zeros(hi - lo, np.int64)
        for r, base in enumerate(np.cumsum(sizes) - sizes):  # the ranks, not the users
            mine = rank == r
            starts[mine] = base + np.cumsum(lengths[mine]) - lengths[mine]
        return torch.cat(parts).numpy()[step_positions(starts, lengths, np.arange(hi - lo))]


def _merge(
    folder: Path,
    *,
    hashes: list[torch.Tensor],
    lengths: list[torch.Tensor],
    key_lengths: list[torch.Tensor],
    keys: list[torch.Tensor],
) -> _Merged:
    """Rank 0: the per-user columns of the table from every rank's ordered users, and the rounds."""
    world = len(hashes)
    held = np.repeat(np.arange(world), [len(h) for h in hashes])
    all_hashes = torch.cat(hashes).numpy().view(np.uint64)
    table = np.argsort(all_hashes, kind="stable")  # equal hashes: the lower rank first
    n = torch.cat(lengths).numpy()
    key_n = torch.cat(key_lengths).numpy()
    key_bytes = torch.cat(keys).numpy()
    with_keys = np.cumsum(key_n) - key_n
    key_ends = np.cumsum(key_n[table])
    for name, values in (
        ("hashes", all_hashes[table]),
        ("key_ends", key_ends),
        ("keys", key_bytes[step_positions(with_keys, key_n, table)]),
        ("ends", np.cumsum(n[table])),
    ):
        with open_column(folder, name, len(values)) as f:
            write_values(f, name, values)
    rank, row_lengths = held[table], n[table]
    # Rounds of about ROUND_STEPS steps, cut between rows (a user longer than a round is a round alone).
    ends = np.cumsum(row_lengths)
    cuts = np.searchsorted(ends, np.arange(ROUND_STEPS, int(ends[-1]) if len(ends) else 0, ROUND_STEPS), side="right")
    rows = np.unique(cuts)
    rows = np.concatenate([[0], rows[(rows > 0) & (rows < len(table))], [len(table)]]).astype(np.int64)
    before = np.stack([np.concatenate([[0], np.cumsum(rank == r)]) for r in range(world)], axis=1)
    return _Merged(folder, rank, row_lengths, rows, before[rows], int(n.sum()))
