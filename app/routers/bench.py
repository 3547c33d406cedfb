"""A no-op endpoint that parses the same body as /recommend and returns the same response shape,
without a model: the honest ceiling of the request path for the load benchmark. Mounted only when
SEQSERVE_BENCH_ENDPOINTS is set."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from app.deps import parse_body, services_of
from app.handlers import json_response
from app.routers.plain import PlainRouter
from app.routers.recommend import result_json, to_query
from models.tasks.recommend import RecResult

router = PlainRouter(tags=["bench"], include_in_schema=False)


@router.post("/bench/noop")
async def noop(request: Request) -> Response:
    body = await parse_body(request, services_of(request).schemas.requests["recommend"].model)
    results = []
    for q in map(to_query, body.queries):  # type: ignore[attr-defined]
        items = [(str(i), 0.0) for i in range(q.k)]
        answer = result_json(RecResult(q.user_id, items, [], {"seen": 0, "future": 0, "requested": 0}))
        answer["version"] = "0"
        results.append(answer)
    return json_response({"model": "noop", "version": "0", "results": results})
