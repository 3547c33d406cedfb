"""Running one measurement of a bench script in another code tree (a `git worktree` of an older commit)."""

from __future__ import annotations

import argparse
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


def tree_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of a script that measures code trees side by side: --variant (repeated), --out, and
    the hidden --one its runs in each tree are started with."""
    p.add_argument("--variant", action="append", default=[], help="name:path of a code tree (default now:.)")
    p.add_argument("--out", type=Path, help="write the report as JSON here")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)


def variants(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The (name, path) of each --variant, in order; this tree alone when none is given."""
    return [(name, tree) for name, _, tree in (v.partition(":") for v in args.variant or ["now:."])]
