#!/usr/bin/env bash
# The retrainer on a plain host: `python -m retrainer` (its docstring has the triggers and settings) in
# the project's environment, beside a running service (SEQSERVE_API_URL) sharing its store and artifacts.
#   SEQSERVE_API_URL=http://127.0.0.1:8000 SEQSERVE_ADMIN_API_KEY=... scripts/retrainer.sh
# The compose `loop` profile runs it as a service: docker compose --profile loop up -d
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh >/dev/null
exec .venv/bin/python -m retrainer "$@"
