from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from app.engine.recommender import RecQuery
from app.routers.common import enforce_limits, history_store, pick
from app.schemas import ErrorResponse, RecommendRequest, RecommendResponse
from app.store import Timeline

router = APIRouter(tags=["recommend"])


@router.post(
    "/recommend",
    response_model=RecommendResponse,
    responses={404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
)
async def recommend(body: RecommendRequest, request: Request) -> RecommendResponse:
    """Top-K next items for each query; all queries of the request in one forward pass."""
    settings = request.app.state.settings
    enforce_limits(settings, body.queries)
    reg = request.app.state.registry
    name, rec = pick(reg.recommenders, reg.broken, body.model, reg.default, "recommendation")
    request.state.model = name
    batcher = reg.rec_batchers[name]
    queries = [
        RecQuery(
            user_id=q.user_id,
            history=[(e.item_id, e.timestamp) for e in q.history or []],
            k=q.k, exclude_seen=q.exclude_seen, exclude_future=q.exclude_future,
            exclude_items=q.exclude_items, as_of=q.as_of,
        )
        for q in body.queries
    ]
    users = [q.user_id for q in queries if q.user_id is not None]
    # The users' events since the artifact was made, so a new interaction counts at once.
    live: dict[str, Timeline] = {}
    if users:
        store = history_store(request)
        if store.local_reads:
            live = store.events(rec.namespace, users)
        else:
            live = await asyncio.to_thread(store.events, rec.namespace, users)
    prepared = rec.prepare(queries, live)
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
