from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from app import serving
from app.deps import parse_body, services_of
from app.handlers import json_response
from app.routers.docs import body_doc, errors
from app.routers.lean import LeanRouter, closed_connection
from app.schemas import RecommendQuery, RecommendResponse
from models.tasks.recommend import RecQuery, RecResult

router = LeanRouter(tags=["recommend"])


def to_query(q: RecommendQuery) -> RecQuery:
    return RecQuery(
        user_id=q.user_id,
        history=[(e.item_id, e.timestamp, e.action) for e in q.history or ()],
        k=q.k,
        exclude_seen=q.exclude_seen,
        exclude_future=q.exclude_future,
        exclude_items=q.exclude_items,
        as_of=q.as_of,
    )


def result_json(r: RecResult) -> dict[str, object]:
    return {
        "user_id": r.user_id,
        "items": [{"item_id": i, "score": s} for i, s in r.items],
        "unknown_items": r.unknown_items,
        "excluded": r.excluded,
        "history_truncated": r.history_truncated,
    }


@router.post(
    "/recommend",
    response_model=RecommendResponse,
    openapi_extra=body_doc("RecommendRequest"),
    responses=errors(404, 422, 503, 504),
)
async def recommend(request: Request) -> Response:
    """Top-K next items (or, from a social model, next users) for each query, in one forward pass."""
    services = services_of(request)
    body = await parse_body(request, services.schemas.recommend)
    with services.registry.lease(body.model, "recommend", services.settings.default_model) as served:
        request.state.model = served.name
        results = await serving.answer(
            served,
            [to_query(q) for q in body.queries],
            store=services.store,
            timeout_s=services.settings.request_timeout_s,
            abandoned=closed_connection(request),
        )
        return json_response(
            {"model": served.name, "version": served.version, "results": [result_json(r) for r in results]}
        )
