#!/usr/bin/env bash
# Train the default models into $SEQSERVE_ARTIFACTS_DIR (artifacts/) when it holds no model.
# --force retrains even when models are there (a new version is published beside the old ones).
# Used by scripts/serve.sh and by the compose `trainer` service.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export SEQSERVE_ARTIFACTS_DIR="${SEQSERVE_ARTIFACTS_DIR:-artifacts}"
geolife="${SEQSERVE_GEOLIFE:-../shared/data/geolife-staypoints/dataSet_geolife.csv}"
if ls "$SEQSERVE_ARTIFACTS_DIR"/*/*/histories.json >/dev/null 2>&1; then
    # Versions written before the memory-mapped history table: the service refuses them, so the
    # newest of each name is converted (a copy published as <version>-2; the old one stays).
    echo "train: versions of the earlier histories.json layout found; converting the newest of each name that needs it" >&2
    .venv/bin/python -m training convert-histories "$SEQSERVE_ARTIFACTS_DIR"
fi
if [ "${1:-}" != "--force" ] && ls "$SEQSERVE_ARTIFACTS_DIR"/*/*/manifest.json >/dev/null 2>&1; then
    echo "train: $SEQSERVE_ARTIFACTS_DIR already holds models; nothing to train (--force retrains)" >&2
    exit 0
fi
echo "train: training the default SASRec on MovieLens-100k into $SEQSERVE_ARTIFACTS_DIR" >&2
.venv/bin/python -m training train --config training/configs/sasrec_ml100k.toml \
    --out "$SEQSERVE_ARTIFACTS_DIR" ${SEQSERVE_DATA:+--data "$SEQSERVE_DATA"}
if [ -f "$geolife" ]; then
    echo "train: training a quick next-location model on $geolife (1 minute budget)" >&2
    .venv/bin/python -m training train --config training/configs/mhsa_geolife.toml \
        --out "$SEQSERVE_ARTIFACTS_DIR" --data "$geolife" --set train.max_minutes=1.0
else
    echo "train: $geolife not found; /next-location stays unavailable until a model is trained" >&2
fi
social="${SEQSERVE_SOCIAL:-../shared/data/mathoverflow/mathoverflow_interactions.csv.gz}"
if [ -f "$social" ]; then
    echo "train: training a quick social model on $social (about 2 minutes)" >&2
    .venv/bin/python -m training train --config training/configs/social_mathoverflow.toml \
        --out "$SEQSERVE_ARTIFACTS_DIR" --data "$social" --set name="'social-mathoverflow-quick'" \
        --set data.recent_examples=50000 --set train.epochs=1 --set train.refit_epochs=0 --set eval.baselines=false
else
    echo "train: $social not found; no social model is served until one is trained" >&2
fi
