"""POST /similar-items: the items most like one item ("more like this"), from the source its model's training
job chose on validation (GET /models says which), with the catalog's rules applied as for /recommend."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from app.deps import ServicesDep, parse_body
from app.errors import InvalidQuery
from app.routers.docs import body_doc, errors
from app.schemas import FieldName, RawId, Strict
from models.catalog import MAX_FILTER_VALUES
from models.engine import MAX_FIELDS, Neighbours, SimilarQuery

MAX_SIMILAR_K = 100  # models.similar.NEIGHBOURS: what a counting source's table holds per item


class SimilarRequest(Strict):
    model: RawId | None = None
    item_id: RawId
    k: int = Field(10, ge=1, le=MAX_SIMILAR_K)
    filter: dict[str, Any] | None = Field(None, description="as for /recommend: a rule over the item fields")
    exclude_items: list[RawId] = Field(default_factory=list, max_length=MAX_FILTER_VALUES)
    fields: list[FieldName] = Field(default_factory=list, max_length=MAX_FIELDS)


class SimilarItem(BaseModel):
    item_id: str
    score: float = Field(description="cosine (embedding) or the pair's count (transitions, cooccurrence)")
    fields: dict[str, str | float | list[str]] | None = None


class SimilarExcluded(BaseModel):
    requested: int
    filtered: int = Field(description="taken out by the filter or because the item is hidden")


class SimilarResponse(BaseModel):
    model: str
    version: str
    item_id: str
    source: Literal["embedding", "transitions", "cooccurrence"]
    items: list[SimilarItem] = Field(description="best first; fewer than k when the rules left fewer")
    complete: bool = Field(description="false when fewer than k items were left to answer with")
    excluded: SimilarExcluded


async def similar_body(request: Request) -> SimilarRequest:
    return await parse_body(request, SimilarRequest)


SimilarBody = Annotated[SimilarRequest, Depends(similar_body)]
router = APIRouter(tags=["recommend"])


@router.post(
    "/similar-items",
    response_model=SimilarResponse,
    openapi_extra=body_doc("SimilarRequest"),
    responses=errors(404, 422, 503),
)
async def similar_items(services: ServicesDep, body: SimilarBody) -> SimilarResponse:
    """The items most like `item_id`, best first, without the excluded, filtered and hidden ones."""
    loaded = services.loaded
    with loaded.lease(body.model, "recommend", services.settings.default_model) as served:
        engine = served.engine
        if not isinstance(engine, Neighbours):
            raise InvalidQuery(
                f"model {served.name!r} ranks {served.task.ranks}: it has no similar items", ["body", "model"]
            )
        query = SimilarQuery(body.item_id, body.k, body.filter, list(body.exclude_items), list(body.fields))
        got = await asyncio.to_thread(engine.similar, query)
        items = [
            SimilarItem(item_id=i, score=s, fields=got.fields[n] if got.fields is not None else None)
            for n, (i, s) in enumerate(got.items)
        ]
        return SimilarResponse(
            model=served.name,
            version=served.version,
            item_id=got.item_id,
            source=got.source,  # type: ignore[arg-type]
            items=items,
            complete=len(items) == body.k,
            excluded=SimilarExcluded(**got.excluded),
        )
