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
pins="$(sha256sum pyproject.toml | cut -c1-16)"
stamp=".venv/.installed-$pins-${extras:-base}"
if [ -f "$stamp" ]; then
    exit 0
fi
# The base install is part of every extras install: any stamp for the same pins will do.
if [ -z "$extras" ] && compgen -G ".venv/.installed-$pins-*" >/dev/null; then
    exit 0
fi
[ -x .venv/bin/python ] || "$py" -m venv .venv
spec="."
[ -n "$extras" ] && spec=".[$extras]"
echo "bootstrap: installing $spec into .venv" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check -e "$spec"
rm -f .venv/.installed-*
touch "$stamp"
