"""Id conventions: the CSV cell escape the export writes and training reads back."""

from __future__ import annotations

import pytest

from models.ids import from_csv_cell, to_csv_cell, trainable


@pytest.mark.parametrize(
    "raw", ["=1+2", "+x", "-3", "@a", "\tt", "\rr", "'", "''", "'=x", "'plain", "plain", "a=b", ""]
)
def test_every_id_survives_the_csv_escape(raw: str) -> None:
    cell = to_csv_cell(raw)
    assert from_csv_cell(cell) == raw
    assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))


def test_a_cell_in_a_log_nobody_escaped_reads_as_written() -> None:
    assert from_csv_cell("'plain") == "'plain" and from_csv_cell("x'=") == "x'="
    assert from_csv_cell("'=x") == "=x"  # the apostrophe rule: what a spreadsheet shows too


def test_an_id_of_only_whitespace_is_not_trainable() -> None:
    assert not trainable("  \t") and not trainable("") and trainable(" a ")
