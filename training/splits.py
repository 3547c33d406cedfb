"""Leave-one-out split over indexed sequences, and training windows."""

from __future__ import annotations

from dataclasses import dataclass

from models.ids import PAD


@dataclass
class EvalSet:
    """One held-out target per user: history, target, and all items the user ever touched."""

    users: list[int]  # user indices
    histories: list[list[int]]
    targets: list[int]
    interacted: list[list[int]]  # every item of the user (for sampling negatives)


@dataclass
class Split:
    train: list[list[int]]  # per-user training sequence
    valid: EvalSet
    test: EvalSet


def leave_one_out(sequences: list[list[int]], full_data: bool = False) -> Split:
    """Last item = test, the one before = validation; users with fewer than 3 items only train.

    With `full_data` every item trains and both evaluation sets are empty.
    """
    if full_data:
        return Split([list(s) for s in sequences], EvalSet([], [], [], []), EvalSet([], [], [], []))
    train, valid, test = [], EvalSet([], [], [], []), EvalSet([], [], [], [])
    for u, seq in enumerate(sequences):
        if len(seq) < 3:
            train.append(list(seq))
            continue
        train.append(seq[:-2])
        valid.users.append(u)
        valid.histories.append(seq[:-2])
        valid.targets.append(seq[-2])
        valid.interacted.append(seq)
        test.users.append(u)
        test.histories.append(seq[:-1])
        test.targets.append(seq[-1])
        test.interacted.append(seq)
    return Split(train, valid, test)


def windows(sequences: list[list[int]], length: int, min_len: int = 2) -> list[list[int]]:
    """Cut each sequence into windows of at most `length`, newest first, overlapping by one item
    so that every consecutive pair is a training transition exactly once."""
    out = []
    for seq in sequences:
        end = len(seq)
        while end >= min_len:
            start = max(0, end - length)
            out.append(seq[start:end])
            if start == 0:
                break
            end = start + 1
    return out


def pad_right(rows: list[list[int]], length: int) -> list[list[int]]:
    return [r + [PAD] * (length - len(r)) for r in rows]
