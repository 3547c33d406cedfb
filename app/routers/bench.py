"""A no-op endpoint that parses the same body as /recommend: the framework's ceiling for the
load benchmark. Mounted only when SEQSERVE_BENCH_ENDPOINTS is set."""

from __future__ import annotations

from fastapi import APIRouter

from app.schemas import RecommendRequest, RecommendResponse

router = APIRouter(tags=["bench"], include_in_schema=False)


@router.post("/bench/noop", response_model=RecommendResponse)
async def noop(body: RecommendRequest) -> RecommendResponse:
    results = [
        {"user_id": q.user_id, "items": [{"item_id": str(i), "score": 0.0} for i in range(q.k)],
         "unknown_items": [], "excluded": {"seen": 0, "future": 0, "requested": 0}, "history_truncated": False}
        for q in body.queries
    ]
    return RecommendResponse.model_validate({"model": "noop", "version": "0", "results": results})
