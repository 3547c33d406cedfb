#!/usr/bin/env bash
# The main command: environment, default models (trained on real data when artifacts/ holds
# none), then the service on http://$SEQSERVE_HOST:$SEQSERVE_PORT (127.0.0.1:8000).
# Also the Docker image's entrypoint.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/train_defaults.sh
exec .venv/bin/uvicorn --factory app.main:app_from_env \
    --host "${SEQSERVE_HOST:-127.0.0.1}" --port "${SEQSERVE_PORT:-8000}" --timeout-graceful-shutdown 20
