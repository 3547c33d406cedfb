"""models.ranking.pad_rows against its previous implementation, on an artifact's real user histories.

    .venv/bin/python bench/pad_rows.py --model sasrec-ml100k

The serving path pads two things per model call: the model's input (each history's last max_len items)
and the seen-item lists (each user's whole history, padded to the batch's longest). Best of 5 repeats,
one thread; both implementations return equal tensors (checked).
"""

from __future__ import annotations

import argparse
import random
import sys
import timeit
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.artifact import latest_versions  # noqa: E402
from models.ranking import pad_rows  # noqa: E402
from models.serving import EngineOptions  # noqa: E402
from models.tasks import TASKS  # noqa: E402


def previous(rows: list[list[int]]) -> torch.Tensor:
    """The earlier way: one torch.tensor over right-padded Python lists."""
    width = max([1, *map(len, rows)])
    return torch.tensor([list(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), width)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    p.add_argument("--model", default="sasrec-ml100k")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    args = p.parse_args()
    torch.set_num_threads(1)
    engine = TASKS["recommend"].open(latest_versions(args.artifacts)[args.model], EngineOptions())
    histories = [found[0] for u in engine.stored_users()  # type: ignore[attr-defined]
                 if (found := engine._stored(u)) is not None]  # type: ignore[attr-defined]
    max_len = engine.model.max_history  # type: ignore[attr-defined]
    rng = random.Random(0)
    lengths = sorted(map(len, histories))
    print(f"{args.model}: {len(histories)} users, history length median {lengths[len(lengths) // 2]}, "
          f"max {lengths[-1]}; the model reads {max_len}")
    print("| batch | rows | width | previous us | pad_rows us | previous / pad_rows |\n|---|---|---|---|---|---|")
    for b in args.batches:
        full = [rng.choice(histories) for _ in range(b)]
        cases = (("seen (whole histories)", full), (f"model input (last {max_len})", [r[-max_len:] for r in full]))
        for name, rows in cases:
            assert torch.equal(previous(rows), pad_rows(rows))
            t_old = min(timeit.repeat(lambda rows=rows: previous(rows), number=200, repeat=5)) / 200 * 1e6
            t_new = min(timeit.repeat(lambda rows=rows: pad_rows(rows), number=200, repeat=5)) / 200 * 1e6
            width = max(map(len, rows))
            print(f"| {b} | {name} | {width} | {t_old:.1f} | {t_new:.1f} | {t_old / t_new:.1f} |")


if __name__ == "__main__":
    main()
