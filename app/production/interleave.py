"""Team-Draft interleaving, framework-free: one answer made of the live and the candidate version's lists,
each position remembered with the side that put it there, and the credit a user's next event gives.

Team-Draft (Radlinski, Kurup and Joachims, CIKM 2008; Chapelle et al., TOIS 2012): the two sides take
turns as captains picking players, the side with fewer picks going next and a coin deciding a tie; each
picks its best item not yet in the answer. Why an item both lists hold credits neither side, and why the
user is the rule's unit: docs/decisions/interleaving.md.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

LIVE, CANDIDATE, BOTH = "L", "C", "B"  # a position's team: which input lists hold its item
Pick = tuple[int, int]  # (0: the live list | 1: the candidate's, the item's index in that list)


def seed_of(model: str, user: str, request: str) -> int:
    """The coin's seed for one answer: the same answer again for the same model, user and request id
    (a `recommendation_id`), on any worker or host (Python's hash() is salted per process)."""
    digest = hashlib.blake2b(f"{model}\x00{user}\x00{request}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def team_draft(live: Sequence[str], candidate: Sequence[str], k: int, *, seed: int) -> tuple[list[Pick], str]:
    """Interleave two ranked lists of distinct ids into at most `k` distinct ids; -> the picks in answer
    order and each position's team: CANDIDATE or LIVE for an item only that list holds (of the lists
    given), BOTH for one both hold (whichever side drafted it)."""
    coin = random.Random(seed)
    held_live, held_cand = set(live), set(candidate)
    taken: set[str] = set()
    picks: list[Pick] = []
    teams: list[str] = []
    counts = [0, 0]
    at = [0, 0]
    lists = (live, candidate)
    while len(picks) < k:
        for side in (0, 1):  # each side's best item not yet in the answer
            while at[side] < len(lists[side]) and lists[side][at[side]] in taken:
                at[side] += 1
        left = [at[side] < len(lists[side]) for side in (0, 1)]
        if not any(left):
            break
        if not left[0] or not left[1]:
            side = 0 if left[0] else 1
        elif counts[0] != counts[1]:
            side = 0 if counts[0] < counts[1] else 1
        else:
            side = coin.randrange(2)
        item = lists[side][at[side]]
        taken.add(item)
        picks.append((side, at[side]))
        counts[side] += 1
        teams.append(BOTH if item in held_live and item in held_cand else (LIVE, CANDIDATE)[side])
    return picks, "".join(teams)


def credit(items: Sequence[str], teams: str, target: str) -> int:
    """What the item a user took next says of an interleaved answer: +1 for the candidate when it is an
    item only the candidate's list held, -1 when only the live list held it, 0 otherwise (not shown, or
    both lists held it)."""
    try:
        team = teams[list(items).index(target)]
    except (ValueError, IndexError):
        return 0
    return 1 if team == CANDIDATE else -1 if team == LIVE else 0
