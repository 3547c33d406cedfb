"""The benchmarks that start servers, each run once on the tiny artifacts so none rots unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.servers import ROOT, free_port

BENCH = ROOT / "bench"


def _run(script: str, *args: str, timeout: float = 240) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_compare_alternates_two_variants_one_logging_every_request(tiny_artifacts: Path, tmp_path: Path) -> None:
    """A variant at INFO writes a line per request: its server must never block on its own output."""
    out = tmp_path / "compare.json"
    _run(
        "compare.py",
        *("--artifacts", str(tiny_artifacts), "--models", "sasrec-tiny", "--paths", "/recommend"),
        *("--concurrency", "4", "--rounds", "2", "--seconds", "2", "--warmup", "0.2"),
        *("--variant", "quiet", "--variant", "logged:SEQSERVE_LOG_LEVEL=INFO"),
        *("--port", str(free_port()), "--out", str(out)),
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["quiet", "logged"]
    assert all(r["rps"] > 0 and r["errors"] == 0 for r in rows)


def test_hostile_attacks_report_what_they_measured(tiny_artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "hostile.json"
    _run(
        "hostile.py",
        *("--artifacts", str(tiny_artifacts), "--model", "sasrec-tiny"),
        *("--attacks", "bodies-in-flight", "half-open", "--bodies", "3", "--half-open", "20"),
        *("--port", str(free_port()), "--out", str(out)),
    )
    found = json.loads(out.read_text())
    assert found["bodies-in-flight"]["connections"] == 3 and found["bodies-in-flight"]["rss_mb_peak"] > 0
    assert found["half-open"]["other_client"]["healthz"] == 200


def test_inprocess_drives_the_app_without_sockets(tiny_artifacts: Path) -> None:
    text = _run(
        "inprocess.py",
        *("--artifacts", str(tiny_artifacts), "--model", "sasrec-tiny", "--path", "/recommend"),
        *("--concurrency", "4", "--requests", "64", "--canned"),
    )
    assert "req/s in-process" in text and "loop thread" in text


def test_online_memory_reports_bytes_per_user_and_scores_every_list() -> None:
    report = json.loads(_run("online_memory.py", "--users", "2000", "--k", "10"))
    assert report["left_after_scoring"] == 0  # one arrival per user scored each user's list
    assert 100 < report["bytes_per_active_user"] < 5000
