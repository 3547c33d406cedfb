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
# app/server.py: uvicorn with the service's connection limits, on SEQSERVE_HOST:SEQSERVE_PORT.
# On SIGTERM it stops accepting and answers what it holds for up to SEQSERVE_DRAIN_S seconds;
# docker-compose.yml's stop_grace_period must stay above it (tests/test_deploy.py).
# SEQSERVE_WORKERS=N: N processes on one port, each loading the models and batching its own
# queue; the history store is shared, /metrics sums every worker's, and one POST /admin/reload
# reloads them all.
exec .venv/bin/python -m app.server
