#!/usr/bin/env bash
# Warm retrain of one served model: its serving version's weights continue on its log plus the live
# events stored since (read from the history store, as app.export_history does), within a budget, and
# the result is published as a new version; then the service reloads. With SEQSERVE_NEW_VERSIONS=canary
# (or shadow) on the service, the new version starts as a candidate beside the live one.
#   scripts/retrain.sh [model name]        (default: $SEQSERVE_RETRAIN_MODEL, else sasrec-ml100k)
# Settings: the service's SEQSERVE_* (artifacts folder, store), SEQSERVE_RETRAIN_MINUTES (0.5),
# SEQSERVE_API_URL (where to POST /admin/reload; unset: no reload) and SEQSERVE_ADMIN_API_KEY.
# The compose `retrain` profile runs it: docker compose --profile retrain run --rm retrain
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh >/dev/null
export SEQSERVE_ARTIFACTS_DIR="${SEQSERVE_ARTIFACTS_DIR:-artifacts}"
name="${1:-${SEQSERVE_RETRAIN_MODEL:-sasrec-ml100k}}"
py=.venv/bin/python
# The version the service serves (pinned, or the newest), else the newest on disk.
version="$($py - "$name" <<'PY'
import json, os, sys, urllib.request
name, url = sys.argv[1], os.environ.get("SEQSERVE_API_URL", "")
try:
    models = json.load(urllib.request.urlopen(f"{url}/models", timeout=10))["models"] if url else []
    print(next(m["version"] for m in models if m["name"] == name))
except (OSError, StopIteration, KeyError, ValueError):
    print("")
PY
)"
folder="$SEQSERVE_ARTIFACTS_DIR/$name${version:+/$version}"
[ -e "$folder" ] || { echo "retrain: no artifact $folder" >&2; exit 2; }
namespace="$($py -c 'import sys; from models.artifact import read_manifest, versions; from pathlib import Path
p = Path(sys.argv[1]); v = p if (p / "manifest.json").is_file() else versions(p)[0]; print(read_manifest(v).namespace)' "$folder")"
log="$(mktemp -d)/$namespace.csv"
trap 'rm -rf "$(dirname "$log")"' EXIT
$py -m app.export_history --namespace "$namespace" --out "$log"
$py -m training warm --artifact "$folder" --data "$log" --minutes "${SEQSERVE_RETRAIN_MINUTES:-0.5}"
if [ -n "${SEQSERVE_API_URL:-}" ]; then
    $py - <<'PY'
import json, os, urllib.request
req = urllib.request.Request(
    os.environ["SEQSERVE_API_URL"] + "/admin/reload", method="POST",
    headers={"X-API-Key": os.environ.get("SEQSERVE_ADMIN_API_KEY", "")},
)
report = json.load(urllib.request.urlopen(req, timeout=120))
print("reload: loaded", report["loaded"], "candidates", report.get("candidates", {}))
PY
fi
