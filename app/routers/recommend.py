"""POST /recommend: top-K next items (SASRec, BERT4Rec) or next users (the social model)."""

from __future__ import annotations

from app.routers.tasks import TaskRoute
from app.schemas import RecommendQuery, RecommendRequest, RecommendResponse, recommend_body
from models.tasks.recommend import RecQuery, RecResult


def to_query(q: RecommendQuery) -> RecQuery:
    return RecQuery(
        user_id=q.user_id,
        history=[(e.item_id, e.timestamp, e.action) for e in q.history or ()],
        k=q.k,
        exclude_seen=q.exclude_seen,
        exclude_future=q.exclude_future,
        exclude_items=q.exclude_items,
        as_of=q.as_of,
        fields=list(q.fields),  # as sent: an error's index is the request's (answers list each field once)
    )


def result_json(r: RecResult) -> dict[str, object]:
    items: list[dict[str, object]] = [{"item_id": i, "score": s} for i, s in r.items]
    if r.fields is not None:
        for item, values in zip(items, r.fields, strict=True):
            item["fields"] = values
    return {
        "user_id": r.user_id,
        "items": items,
        "unknown_items": r.unknown_items,
        "excluded": r.excluded,
        "history_truncated": r.history_truncated,
    }


def queries(body: RecommendRequest) -> list[RecQuery]:
    return [to_query(q) for q in body.queries]


ROUTE = TaskRoute(
    name="recommend",
    path="/recommend",
    tag="recommend",
    summary="Top-K next items (or, from a social model, next users) for each query, in one forward pass.",
    body=recommend_body,
    response=RecommendResponse,
    queries=queries,
    result=result_json,
    live_events=True,
)
