# seqserve image: the same scripts as on a developer machine (scripts/serve.sh is the entrypoint).
#   CPU (default):  docker build -t seqserve .
#   CUDA:           docker build --build-arg VARIANT=cuda -t seqserve:cuda .
# The CPU variant takes torch from PyTorch's CPU wheel index (the PyPI wheel bundles CUDA, ~GBs);
# the CUDA variant takes the PyPI wheel, which brings its own CUDA runtime (run with --gpus all).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG VARIANT=cpu
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY app ./app
COPY models ./models
COPY training ./training
COPY retrainer ./retrainer
COPY scripts ./scripts
RUN case "$VARIANT" in \
        cpu) export PIP_EXTRA_INDEX_URL="$TORCH_CPU_INDEX" ;; \
        cuda) ;; \
        *) echo "VARIANT must be cpu or cuda, not $VARIANT" >&2; exit 1 ;; \
    esac \
    && scripts/bootstrap.sh \
    && find .venv -name '__pycache__' -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
ARG VARIANT=cpu
LABEL org.opencontainers.image.title="seqserve" org.opencontainers.image.description="sequential model serving (${VARIANT})"
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin seqserve
WORKDIR /app
# Same path as in the build stage: the editable install and the venv's scripts point at /app.
COPY --from=build /app /app
# Writable by the service user: artifacts (a volume; mounted read-only into the api), the SQLite
# history store, and the MovieLens cache used when ../shared/data is not mounted.
RUN mkdir -p /app/artifacts /app/state /app/data && chown seqserve:seqserve /app/artifacts /app/state /app/data
USER seqserve
ENV SEQSERVE_HOST=0.0.0.0 \
    SEQSERVE_PORT=8000 \
    SEQSERVE_ARTIFACTS_DIR=/app/artifacts \
    SEQSERVE_HISTORY_PATH=/app/state/history.sqlite3 \
    PYTHONDONTWRITEBYTECODE=1
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["/app/.venv/bin/python", "-c", "import os, sys, urllib.request; r = urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('SEQSERVE_PORT', '8000')}/readyz\", timeout=4); sys.exit(r.status != 200)"]
ENTRYPOINT ["scripts/serve.sh"]
