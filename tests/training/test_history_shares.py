"""The artifact's history table from every rank's users, written by rank 0 in rounds, is the table one
process writes from all of them, byte for byte."""

from __future__ import annotations

import filecmp
from pathlib import Path

import numpy as np
import pytest

from models.history_table import HistoryTable, write_table
from tests.training.ranks import spawn_ranks
from training import history_shares
from training.distributed import Dist
from training.history_shares import HistoryShares

_OFFSET = 3  # as the job's map's special indices
_ROUND = 7  # steps a round: many rounds, and users longer than one


def _log(n_users: int = 60) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(users, lengths, items, times): varied lengths (one user longer than several rounds), ids
    of several lengths and scripts, times with gaps (NaN)."""
    rng = np.random.default_rng(0)
    users = [f"u{i}" if i % 3 else f"usuário-{i}-{'x' * (i % 7)}" for i in range(n_users)]
    lengths = rng.integers(1, 12, n_users)
    lengths[5] = 4 * _ROUND + 1
    n = int(lengths.sum())
    times = rng.uniform(0, 1e9, n)
    times[::11] = np.nan
    return users, lengths, rng.integers(0, 500, n).astype(np.int32), times


def _share(rank: int, world: int) -> HistoryShares:
    """Rank `rank`'s users of `_log` (every world-th, as a hash would scatter them), as the job holds them."""
    users, lengths, items, times = _log()
    starts = np.cumsum(lengths) - lengths
    mine = np.arange(rank, len(users), world)
    take = np.concatenate([np.arange(starts[u], starts[u] + lengths[u]) for u in mine])
    return HistoryShares(
        [users[u] for u in mine],
        np.cumsum(lengths[mine]),
        items=items[take],
        times=times[take],
        item_offset=_OFFSET,
        dist=Dist(rank, world, own_data=True),
    )


def _one_process_table(folder: Path) -> Path:
    users, lengths, items, times = _log()
    write_table(folder, users, lengths, items=items + _OFFSET, times=times)
    return folder


def _same_files(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert (mismatch, errors) == ([], []) and match == names


def test_one_process_writes_in_rounds_the_table_it_writes_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history_shares, "ROUND_STEPS", _ROUND)
    users, lengths, items, times = _log()
    HistoryShares(users, np.cumsum(lengths), items=items, times=times, item_offset=_OFFSET).write(tmp_path / "rounds")
    _same_files(tmp_path / "rounds", _one_process_table(tmp_path / "once"))
    span = HistoryTable(tmp_path / "rounds").span(users[5])
    assert span is not None and span[1] - span[0] == 4 * _ROUND + 1


def _write_a_share(rank: int, world: int, port: int, out: Path) -> None:
    import torch.distributed as tdist

    history_shares.ROUND_STEPS = _ROUND
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        share = _share(rank, world)
        if rank == 0:
            share.write(out)
        else:
            share.send()
    finally:
        tdist.destroy_process_group()


def test_rank_zero_writes_every_rank_s_users_into_the_table_one_process_writes(tmp_path: Path) -> None:
    """Three gloo ranks, each with a third of the users: rank 0's table, written in rounds from what
    each rank sends, is byte for byte the one a process holding every user writes."""
    from bench.servers import free_port

    spawn_ranks(_write_a_share, (3, free_port(), tmp_path / "ranks"), ranks=3)
    _same_files(tmp_path / "ranks", _one_process_table(tmp_path / "once"))


def test_a_rank_with_a_broken_row_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    share = _share(0, 1)
    share.times = share.times.copy()
    share.times[0] = np.inf
    with pytest.raises(ValueError, match="infinite"):
        share.write(tmp_path / "t")
    assert not any((tmp_path / "t").iterdir())
