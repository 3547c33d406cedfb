"""Running one measurement of a bench script in another code tree (a `git worktree` of an older commit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_in_tree(script: str, name: str, tree: str, args: list[str]) -> dict[str, Any]:
    """`script --one *args` with `tree` as working directory and import path: its last stdout line
    as JSON. Exits with the run's stderr when it fails."""
    cmd = [sys.executable, str(Path(script).resolve()), "--one", *args]
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return got
