#!/usr/bin/env bash
# Train the default models into $SEQSERVE_ARTIFACTS_DIR (artifacts/) when it holds no model.
# --force retrains even when models are there (a new version is published beside the old ones).
# Used by scripts/serve.sh and by the compose `trainer` service.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export SEQSERVE_ARTIFACTS_DIR="${SEQSERVE_ARTIFACTS_DIR:-artifacts}"
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
# Each task's default models, as the task table lists them (models.tasks: DefaultRun); a data set
# that is not there is skipped and the log names the variable that points to it
# (SEQSERVE_DATA: MovieLens-100k, SEQSERVE_GEOLIFE, SEQSERVE_SOCIAL).
echo "train: training the default models into $SEQSERVE_ARTIFACTS_DIR" >&2
.venv/bin/python -m training defaults --out "$SEQSERVE_ARTIFACTS_DIR"
