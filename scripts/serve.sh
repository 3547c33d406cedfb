#!/usr/bin/env bash
# The main command: environment, default models (trained on real data when artifacts/ holds
# none), then the service on http://$SEQSERVE_HOST:$SEQSERVE_PORT (127.0.0.1:8000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export SEQSERVE_ARTIFACTS_DIR="${SEQSERVE_ARTIFACTS_DIR:-artifacts}"
geolife="${SEQSERVE_GEOLIFE:-../shared/data/geolife-staypoints/dataSet_geolife.csv}"
if ! ls "$SEQSERVE_ARTIFACTS_DIR"/*/*/manifest.json >/dev/null 2>&1; then
    echo "serve: no model under $SEQSERVE_ARTIFACTS_DIR; training the default SASRec on MovieLens-100k" >&2
    .venv/bin/python -m training train --config training/configs/sasrec_ml100k.toml \
        --out "$SEQSERVE_ARTIFACTS_DIR" ${SEQSERVE_DATA:+--data "$SEQSERVE_DATA"}
    if [ -f "$geolife" ]; then
        echo "serve: training a quick next-location model on $geolife (1 minute budget)" >&2
        .venv/bin/python -m training train --config training/configs/mhsa_geolife.toml \
            --out "$SEQSERVE_ARTIFACTS_DIR" --data "$geolife" --set train.max_minutes=1.0
    else
        echo "serve: $geolife not found; /next-location stays unavailable until a model is trained" >&2
    fi
fi
exec .venv/bin/uvicorn --factory app.main:app_from_env \
    --host "${SEQSERVE_HOST:-127.0.0.1}" --port "${SEQSERVE_PORT:-8000}"
