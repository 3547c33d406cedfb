#!/usr/bin/env bash
# The test command: environment with dev tools, lint, types, tests. Any failure fails the run,
# and so does pytest collecting no test (exit code 5).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh dev
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
