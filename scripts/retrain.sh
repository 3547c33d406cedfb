#!/usr/bin/env bash
# Warm retrain of one served model, then the service reloads: `python -m retrainer.retrain` (its docstring has
# the settings) in the project's environment.
#   scripts/retrain.sh [model name]        (default: $SEQSERVE_RETRAIN_MODEL, else sasrec-ml100k)
# The compose `retrain` profile runs it: docker compose --profile retrain run --rm retrain
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh >/dev/null
exec .venv/bin/python -m retrainer.retrain "$@"
