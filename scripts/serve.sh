#!/usr/bin/env bash
# The main command: environment, default models (trained on real data when artifacts/ holds
# none), then the service on http://$SEQSERVE_HOST:$SEQSERVE_PORT (127.0.0.1:8000).
# Also the Docker image's entrypoint.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/train_defaults.sh
# Fewer malloc arenas: the model thread and the event loop otherwise fragment memory into
# per-thread arenas (resident memory after a load run: 790 MB by default, 550 MB with 2).
export MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}"
# On SIGTERM the server stops accepting and answers what it holds for up to SEQSERVE_DRAIN_S
# seconds; docker-compose.yml's stop_grace_period must stay above it (tests/test_deploy.py).
# SEQSERVE_WORKERS=N: N processes on one port, each loading the models and batching its own
# queue; the history store is shared, and /metrics sums every worker's (prometheus-client's
# multiprocess mode, in a folder emptied at each start).
workers="${SEQSERVE_WORKERS:-1}"
if [ "$workers" -gt 1 ]; then
    export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-state/metrics}"
    rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
fi
exec .venv/bin/uvicorn --factory app.main:app_from_env --workers "$workers" \
    --host "${SEQSERVE_HOST:-127.0.0.1}" --port "${SEQSERVE_PORT:-8000}" \
    --timeout-graceful-shutdown "${SEQSERVE_DRAIN_S:-20}"
