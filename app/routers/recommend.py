from __future__ import annotations

from fastapi import APIRouter, Request

from app.engine.recommender import Recommender, RecQuery
from app.errors import LimitExceeded, ModelUnavailable, UnknownModel
from app.schemas import ErrorResponse, RecommendRequest, RecommendResponse

router = APIRouter(tags=["recommend"])


def pick_model(request: Request, name: str | None) -> tuple[str, Recommender]:
    reg = request.app.state.registry
    name = name or reg.default
    if name is None:
        raise ModelUnavailable("no recommendation model is loaded", ["body", "model"])
    rec = reg.recommenders.get(name)
    if rec is None:
        if name in reg.broken:
            raise ModelUnavailable(f"model {name!r} failed to load: {reg.broken[name]}", ["body", "model"])
        raise UnknownModel(f"unknown model {name!r}; loaded: {sorted(reg.recommenders)}", ["body", "model"])
    return name, rec


@router.post(
    "/recommend",
    response_model=RecommendResponse,
    responses={404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
)
async def recommend(body: RecommendRequest, request: Request) -> RecommendResponse:
    """Top-K next items for each query; all queries of the request in one forward pass."""
    settings = request.app.state.settings
    if len(body.queries) > settings.max_queries:
        raise LimitExceeded(f"at most {settings.max_queries} queries per request", ["body", "queries"])
    for n, q in enumerate(body.queries):
        if q.k > settings.max_k:
            raise LimitExceeded(f"k must be at most {settings.max_k}", ["body", "queries", n, "k"])
        if q.history and len(q.history) > settings.max_history:
            raise LimitExceeded(
                f"at most {settings.max_history} history events per query", ["body", "queries", n, "history"]
            )
    name, rec = pick_model(request, body.model)
    request.state.model = name
    batcher = request.app.state.registry.rec_batchers[name]
    queries = [
        RecQuery(
            user_id=q.user_id,
            history=[(e.item_id, e.timestamp) for e in q.history or []],
            k=q.k, exclude_seen=q.exclude_seen, exclude_future=q.exclude_future,
            exclude_items=q.exclude_items, as_of=q.as_of,
        )
        for q in body.queries
    ]
    prepared = rec.prepare(queries)
    results = await batcher.submit(prepared, settings.request_timeout_s)
    return RecommendResponse.model_validate(
        {
            "model": name,
            "version": str(rec.art.manifest["version"]),
            "results": [
                {
                    "user_id": r.user_id,
                    "items": [{"item_id": i, "score": s} for i, s in r.items],
                    "unknown_items": r.unknown_items,
                    "excluded": r.excluded,
                    "history_truncated": r.history_truncated,
                }
                for r in results
            ],
        }
    )
