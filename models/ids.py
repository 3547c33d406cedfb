"""Id conventions shared by training and serving: raw string ids <-> dense indices."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

PAD = 0
UNK = 1
N_SPECIAL = 2  # indices below this are never a real entity


class IdMap:
    """Bijection between raw string ids and indices; 0 = padding, 1 = unknown, entities from 2."""

    def __init__(self, raw_ids: Iterable[str] = ()) -> None:
        self._to_index: dict[str, int] = {}
        self._to_raw: list[str | None] = [None, None]
        for raw in raw_ids:
            self.add(raw)

    def add(self, raw: str) -> int:
        raw = str(raw)
        idx = self._to_index.get(raw)
        if idx is None:
            idx = len(self._to_raw)
            self._to_index[raw] = idx
            self._to_raw.append(raw)
        return idx

    def __len__(self) -> int:
        """Vocabulary size, the two special indices included."""
        return len(self._to_raw)

    @property
    def n_entities(self) -> int:
        return len(self._to_raw) - N_SPECIAL

    def __contains__(self, raw: object) -> bool:
        return str(raw) in self._to_index

    def index(self, raw: str) -> int:
        """Index of `raw`, or UNK when it was never seen."""
        return self._to_index.get(str(raw), UNK)

    def indices(self, raws: Sequence[str]) -> list[int]:
        get = self._to_index.get
        return [get(str(r), UNK) for r in raws]

    def raw(self, index: int) -> str | None:
        """Raw id of `index`; None for padding and unknown."""
        return self._to_raw[index]

    def raws(self) -> list[str]:
        """Raw ids in index order, starting at index 2."""
        return [r for r in self._to_raw[N_SPECIAL:] if r is not None]

    def to_json(self) -> dict[str, object]:
        return {"pad": PAD, "unk": UNK, "ids": self.raws()}

    @classmethod
    def from_json(cls, obj: dict[str, object]) -> IdMap:
        if obj.get("pad") != PAD or obj.get("unk") != UNK or not isinstance(obj.get("ids"), list):
            raise ValueError("not an IdMap document (expects pad=0, unk=1 and an 'ids' list)")
        ids = obj["ids"]
        assert isinstance(ids, list)
        m = cls(str(r) for r in ids)
        if m.n_entities != len(ids):
            raise ValueError("IdMap document holds duplicate ids")
        return m

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: Path) -> IdMap:
        return cls.from_json(json.loads(path.read_text()))


def encodable(raw: str) -> bool:
    """Whether `raw` is valid Unicode (JSON can carry lone surrogates; UTF-8 and answers cannot)."""
    try:
        raw.encode()
    except UnicodeEncodeError:
        return False
    return True


def trainable(raw: str) -> bool:
    """Whether a log may hold `raw` as a user, item or action id: training refuses one that is only
    whitespace (training.data.tables.require_ids), so the service refuses to store one."""
    return bool(raw.strip())


# A CSV cell a spreadsheet would run as a formula starts with one of these. The service's log export
# writes such an id behind a leading apostrophe (the spreadsheets' own text marker), and an id that
# itself starts with an apostrophe behind one more; training's CSV readers take exactly one off
# (escaped_in_csv / from_csv_cell), so every id reads back as it was stored.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_ESCAPED = re.compile(r"^'[=+\-@\t\r']")


def to_csv_cell(raw: str) -> str:
    """`raw` as a CSV cell no spreadsheet runs (the apostrophe rule above)."""
    return "'" + raw if raw.startswith((*FORMULA_START, "'")) else raw


def from_csv_cell(cell: str) -> str:
    """The id a `to_csv_cell` cell holds."""
    return cell[1:] if _ESCAPED.match(cell) else cell
