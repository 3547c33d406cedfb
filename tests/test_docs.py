"""docs/ stays a reference: BENCHMARKS holds current figures only, every decision it points to exists,
and no page cites an uncommitted run folder as its evidence."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmarks_stay_a_page_of_current_figures() -> None:
    lines = (ROOT / "docs" / "BENCHMARKS.md").read_text().splitlines()
    assert len(lines) < 700, f"{len(lines)} lines: move experiment accounts to docs/decisions/"


def test_every_decision_record_and_experiment_cited_exists() -> None:
    """Cited from the README, the docs or the code (comments and docstrings)."""
    cited = set()
    code = [
        p
        for package in ("app", "models", "training", "retrainer", "bench", "scripts", "ops")
        for p in (ROOT / package).rglob("*.*")
    ]
    for doc in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *code]:
        if doc.suffix in {".md", ".py", ".sh", ".yml", ".cfg"}:
            cited |= set(re.findall(r"docs/((?:decisions|experiments)/[a-z0-9-]+\.md)", doc.read_text()))
    missing = sorted(c for c in cited if not (ROOT / "docs" / c).is_file())
    assert missing == []


def runs_citations(text: str) -> list[str]:
    """Where a page names a `runs/` path other than inside a command: a fenced block, or an inline code
    span with arguments (`--out runs/x`). A bare `runs/x` is a folder nobody else has."""
    prose = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.S | re.M)
    spans = re.findall(r"`([^`]+)`", prose)
    bare = [s for s in spans if "runs/" in s and len(s.split()) == 1]
    outside = re.sub(r"`[^`]+`", " ", prose)
    return bare + re.findall(r"\S*runs/\S*", outside)


def test_no_page_cites_a_run_folder_as_evidence() -> None:
    assert runs_citations("```bash\npython -m training train --out runs/x\n```\nsee `--out runs/y` then") == []
    assert runs_citations("as measured in `runs/x/metrics.json`") == ["runs/x/metrics.json"]
    assert runs_citations("as measured in runs/x") == ["runs/x"]
    found = {}
    for doc in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        if cited := runs_citations(doc.read_text()):
            found[str(doc.relative_to(ROOT))] = cited
    assert found == {}, "cite the command that writes it, not the folder"


def test_the_settings_page_is_written_from_the_settings_and_says_what_each_one_does() -> None:
    """docs/settings.md is what scripts/settings_doc.py writes (rerun it after changing a setting), and every
    setting has a comment in the code to say what it does."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("settings_doc", ROOT / "scripts" / "settings_doc.py")
    assert spec is not None and spec.loader is not None
    doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc)
    page = doc.render()
    assert (ROOT / "docs" / "settings.md").read_text() == page, "run: python scripts/settings_doc.py"
    rows = [line for line in page.splitlines() if line.startswith("| `SEQSERVE_")]
    from app.settings import Settings
    from retrainer.settings import RetrainerSettings

    assert len(rows) == len(set(Settings.model_fields) | set(RetrainerSettings.model_fields))
    assert [r for r in rows if r.endswith("|  |")] == []
