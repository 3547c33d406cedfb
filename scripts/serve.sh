#!/usr/bin/env bash
# The main command: environment, default model (trained on real data when artifacts/ holds
# none), then the service on http://$SEQSERVE_HOST:$SEQSERVE_PORT (127.0.0.1:8000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export SEQSERVE_ARTIFACTS_DIR="${SEQSERVE_ARTIFACTS_DIR:-artifacts}"
if ! ls "$SEQSERVE_ARTIFACTS_DIR"/*/*/manifest.json >/dev/null 2>&1; then
    echo "serve: no model under $SEQSERVE_ARTIFACTS_DIR; training the default SASRec on MovieLens-100k" >&2
    .venv/bin/python -m training train --config training/configs/sasrec_ml100k.toml \
        --out "$SEQSERVE_ARTIFACTS_DIR" ${SEQSERVE_DATA:+--data "$SEQSERVE_DATA"}
fi
exec .venv/bin/uvicorn --factory app.main:app_from_env \
    --host "${SEQSERVE_HOST:-127.0.0.1}" --port "${SEQSERVE_PORT:-8000}"
