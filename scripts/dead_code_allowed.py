"""Names the dead-code check (vulture, in scripts/test.sh) cannot see used, each with who uses it.

Not imported by anything: vulture reads it beside the packages, and a name listed here counts as used.
"""

# uvicorn imports it by name: "app.main:app_from_env" (app/server.py, bench/serving/load.py).
from app.main import app_from_env

# Response models' fields: filled by keyword and read by clients through the OpenAPI document.
from app.routers.next_location import ScoredLocation
from app.schemas import ModelsResponse, OnlineResponse, ReloadReport
from app.schemas import EventResult as _EventResult
from app.routers.models import ModelInfo as _ModelInfo
from app.routers.recommend import Excluded as _Excluded
from app.routers.similar import SimilarExcluded as _SimilarExcluded
from bench.servers import start_api as _start_api

app_from_env

# uvicorn imports the benches' app by name too: "bench.serving.noop:create" (bench/serving/noop.py, bench/servers.py).
noop_app = object()
noop_app.create

ScoredLocation.probability
_ModelInfo.similar_items
_Excluded.filtered
_SimilarExcluded.filtered

# tests/servers.py starts the service through it (the benches use start_server).
_start_api
_EventResult.unknown_item
ReloadReport.loaded
ReloadReport.unchanged
ReloadReport.all_workers
OnlineResponse.bucket_s
OnlineResponse.segments

# LitServe calls these on the peer server's API class (bench/serving/litserve_server.py).
litserve_api = object()
litserve_api.decode_request
litserve_api.predict
litserve_api.encode_response

# uvicorn's RequestResponseCycle reads it after the response (app/server.py: a reserve answer closes).
request_cycle = object()
request_cycle.keep_alive

# The Redis Cluster's tests find which node to kill or pause with these (tests/app/test_redis_cluster.py).
cluster_nodes = object()
cluster_nodes.primary_of
cluster_nodes.replica_of
cluster_nodes.restart
