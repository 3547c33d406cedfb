#!/usr/bin/env bash
# Restart the api replicas one batch at a time, never all at once: new replicas (with the compose file's
# and the environment's current settings and image) start beside the old ones and must be healthy before
# each old one is stopped (SIGTERM: it drains what it holds while the balancer stops sending it requests).
# `docker compose restart api`, or an `up -d` that changes the api's settings, stops every replica at once.
#   ops/rolling-restart.sh            # as many replicas as run now
#   COMPOSE="docker compose -f docker-compose.yml -f docker-compose.secrets.yml" ops/rolling-restart.sh
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a compose <<<"${COMPOSE:-docker compose}"
old=$("${compose[@]}" ps -q api)
count=$(wc -w <<<"$old")
[ "$count" -gt 0 ] || { echo "rolling-restart: no api replica runs; use docker compose up" >&2; exit 1; }
echo "rolling-restart: $count replica(s); starting $count new beside them" >&2
"${compose[@]}" up -d --no-deps --no-recreate --scale api=$((2 * count)) api
new=$(comm -13 <(sort <<<"$old") <(sort < <("${compose[@]}" ps -q api)))
deadline=$((SECONDS + ${SEQSERVE_ROLLING_WAIT_S:-600}))
for id in $new; do
    until [ "$(docker inspect -f '{{.State.Health.Status}}' "$id")" = healthy ]; do
        if [ "$(docker inspect -f '{{.State.Status}}' "$id")" != running ] || [ $SECONDS -gt $deadline ]; then
            echo "rolling-restart: new replica $id is not healthy; the old ones keep serving. Its log:" >&2
            docker logs --tail 30 "$id" >&2 || true
            docker rm -f $new >/dev/null
            exit 1
        fi
        sleep 2
    done
done
for id in $old; do
    echo "rolling-restart: stopping old replica $id" >&2
    docker stop -t 30 "$id" >/dev/null && docker rm "$id" >/dev/null
done
echo "rolling-restart: done; $count replica(s) on the current settings" >&2
