#!/usr/bin/env bash
# Make .venv and install the project (pins in pyproject.toml) when it is missing or stale.
# Usage: scripts/bootstrap.sh [extras], e.g. "dev". Idempotent and quick when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 13) else 1)'; then
    echo "bootstrap: need Python 3.11 or 3.12 (set PYTHON=...); found $("$py" --version 2>&1)" >&2
    exit 1
fi
stamp=".venv/.installed-$( (cat pyproject.toml; echo "$extras") | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
    exit 0
fi
[ -x .venv/bin/python ] || "$py" -m venv .venv
spec="."
[ -n "$extras" ] && spec=".[$extras]"
echo "bootstrap: installing $spec into .venv" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check -e "$spec"
rm -f .venv/.installed-*
touch "$stamp"
