#!/usr/bin/env bash
# The GPU bench (bench/scale/gpu.py) on a machine whose Python has torch with CUDA but not the service's web
# dependencies, and no network.
#
#   bench/scale/gpu.sh fetch DIR                # on a machine with network and this checkout's .venv: the wheels
#   bench/scale/gpu.sh run DIR -- GPU_PY_ARGS   # on the GPU machine: install DIR's wheels, run bench/scale/gpu.py
#   bench/scale/gpu.sh python DIR -- ARGS       # the same, then python3 ARGS (another bench, a training sweep)
#
# fetch downloads, for CPython $PYVER (default 3.12) on x86-64 Linux, the exact versions this checkout's
# .venv runs of WHEELS below: the packages the service and the tests import that a PyTorch image lacks
# (torch, numpy, pandas, uvloop, prometheus-client, pytest and the rest come with such an image).
# run installs them with --no-deps into a folder of their own, first on PYTHONPATH, so the machine's
# torch stays untouched.
set -euo pipefail
cd "$(dirname "$0")/../.."

WHEELS=(fastapi starlette pydantic pydantic-core pydantic-settings python-dotenv typing-inspection
        annotated-types annotated-doc typing-extensions opentelemetry-api uvicorn httptools orjson
        redis hiredis fastapi-offline httpx2 httpcore2 truststore)

usage() { sed -n '4,7p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
verb=$1 dir=$2
shift 2

case "$verb" in
fetch)
    pins=()
    for name in "${WHEELS[@]}"; do
        version=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
        pins+=("$name==$version")
    done
    mkdir -p "$dir"
    platforms=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
        platforms+=(--platform "$p")
    done
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" \
        --implementation cp "${platforms[@]}" -d "$dir" "${pins[@]}"
    ls "$dir"
    ;;
run|python)
    [ "${1:-}" = "--" ] && shift
    site=${SITE:-/tmp/seqserve-site}
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$dir"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    [ "$verb" = run ] && exec python3 -m bench.scale.gpu "$@"
    exec python3 "$@"
    ;;
*) usage ;;
esac
