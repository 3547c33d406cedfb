"""A no-op endpoint that parses the same body as /recommend and returns the same response shape,
without a model: the honest ceiling of the request path for the load benchmarks. The benches mount it
on the service's own app (the production routers never hold it), right behind /recommend so that it
pays the same route walk:

    .venv/bin/python -m bench.serving.noop      # the service (app.server, its settings) with POST /bench/noop
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from app.deps import parse_body, services_of
from app.handlers import json_response
from app.main import app_from_env, create_app
from app.production.trials import new_id
from app.routers.plain import PlainRouter
from app.routers.recommend import result_json, to_query
from app.settings import Settings
from models.tasks.recommend import RecResult

router = PlainRouter(tags=["bench"], include_in_schema=False)


@router.post("/bench/noop")
async def noop(request: Request) -> Response:
    body = await parse_body(request, services_of(request).schemas.requests["recommend"].model)
    results = []
    for q in map(to_query, body.queries):  # type: ignore[attr-defined]
        items = [(str(i), 0.0) for i in range(q.k)]
        answer = result_json(RecResult(q.user_id, items, [], {"seen": 0, "future": 0, "requested": 0}))
        if q.user_id is not None:
            answer["recommendation_id"] = new_id()
        answer["version"] = "0"
        results.append(answer)
    return json_response({"model": "noop", "version": "0", "results": results})


def mount_noop(app: FastAPI) -> FastAPI:
    """`app` with POST /bench/noop right behind /recommend (routes are tried in order)."""
    routes = app.router.routes
    at = next(n for n, r in enumerate(routes) if getattr(r, "path", None) == "/recommend") + 1
    routes[at:at] = router.routes
    return app


def create() -> FastAPI:
    """Factory for uvicorn: the service from its environment, with the no-op."""
    return mount_noop(app_from_env())


def create_with(settings: Settings) -> FastAPI:
    return mount_noop(create_app(settings))


if __name__ == "__main__":
    from app.server import main

    main(app="bench.serving.noop:create")
