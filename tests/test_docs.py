"""docs/ stays a reference: BENCHMARKS holds current figures only, every decision it points to exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmarks_stay_a_page_of_current_figures() -> None:
    lines = (ROOT / "docs" / "BENCHMARKS.md").read_text().splitlines()
    assert len(lines) < 700, f"{len(lines)} lines: move experiment accounts to docs/decisions/"


def test_every_decision_record_cited_exists() -> None:
    cited = set()
    for doc in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        cited |= set(re.findall(r"docs/decisions/([a-z0-9-]+\.md)", doc.read_text()))
    missing = sorted(c for c in cited if not (ROOT / "docs" / "decisions" / c).is_file())
    assert missing == []
