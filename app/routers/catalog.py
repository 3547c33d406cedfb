"""A catalog's rules an admin sets: items taken out of every answer (hide, unhide, the list), and named
filters queries use by name (put, delete, the list)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, Field

from app.deps import AdminKey, Services, ServicesDep, parse_body
from app.errors import InvalidQuery, StoreUnavailable, TooManyRules, UnknownModel
from app.routers.docs import body_doc, errors
from app.schemas import ModelNamePath, RawId, StoredId, Strict, UnixTime
from app.store import MAX_HIDDEN, MAX_NAMED_FILTERS, HiddenItem, ProductionState, StoreError

MAX_HIDE = 1000  # ids per call
MAX_FILTER_BYTES = 64 * 1024  # a named filter's expression, as JSON


class HideRequest(Strict):
    # No item a model knows is blank (training refuses such ids), so a blank one is a mistake; unhide still
    # takes any id, so one stored before this rule can be removed.
    item_ids: list[StoredId] = Field(min_length=1, max_length=MAX_HIDE)
    until: UnixTime | None = Field(None, description="shown again after this; default: until unhidden")
    reason: str = Field("", max_length=200, description="kept with the items, for whoever lists them")


class UnhideRequest(Strict):
    item_ids: list[RawId] = Field(min_length=1, max_length=MAX_HIDE)


class HiddenInfo(BaseModel):
    item_id: str
    until: float | None
    reason: str
    hidden_at: float


class HiddenChange(BaseModel):
    name: str
    changed: int = Field(description="items hidden (or updated) by this call; for unhide, shown again")
    hidden: int = Field(description="items of the model hidden now")


class HiddenList(BaseModel):
    name: str
    items: list[HiddenInfo] = Field(description="hidden now, newest first (those whose `until` passed are left out)")


async def hide_body(request: Request) -> HideRequest:
    return await parse_body(request, HideRequest)


async def unhide_body(request: Request) -> UnhideRequest:
    return await parse_body(request, UnhideRequest)


router = APIRouter(tags=["catalog"])


@router.post(
    "/admin/models/{name}/items/hide",
    response_model=HiddenChange,
    openapi_extra=body_doc("HideRequest"),
    responses=errors(401, 403, 404, 409, 422, 503),
    dependencies=[AdminKey],
)
async def hide(
    services: ServicesDep, name: ModelNamePath, body: Annotated[HideRequest, Depends(hide_body)]
) -> HiddenChange:
    """Take items out of every answer of `name` (every version, candidate, shadow and interleaved list, and
    /similar-items), on every worker and host sharing the store within one housekeeping tick. Retraining
    keeps them in the data; they stay hidden until unhidden (or `until`)."""
    state = _state(services, name)
    now = time.time()
    items = {i: HiddenItem(body.until, body.reason, now) for i in dict.fromkeys(body.item_ids)}
    with _store_calls("the items could not be hidden"):
        held = await asyncio.to_thread(state.hidden, name)
        if len(set(held) | set(items)) > MAX_HIDDEN:
            raise TooManyRules(f"model {name!r} would hold more than {MAX_HIDDEN} hidden items", ["body", "item_ids"])
        total = await asyncio.to_thread(state.hide, name, items)
    await _refresh(services, name)
    return HiddenChange(name=name, changed=len(items), hidden=total)


@router.post(
    "/admin/models/{name}/items/unhide",
    response_model=HiddenChange,
    openapi_extra=body_doc("UnhideRequest"),
    responses=errors(401, 403, 404, 422, 503),
    dependencies=[AdminKey],
)
async def unhide(
    services: ServicesDep, name: ModelNamePath, body: Annotated[UnhideRequest, Depends(unhide_body)]
) -> HiddenChange:
    """Show items of `name` again."""
    state = _state(services, name)
    with _store_calls("the items could not be shown again"):
        gone = await asyncio.to_thread(state.unhide, name, list(dict.fromkeys(body.item_ids)))
        left = len(await asyncio.to_thread(state.hidden, name))
    await _refresh(services, name)
    return HiddenChange(name=name, changed=gone, hidden=left)


@router.get("/models/{name}/items/hidden", response_model=HiddenList, responses=errors(404, 422, 503))
async def hidden(services: ServicesDep, name: ModelNamePath) -> HiddenList:
    """The items of `name` taken out of its answers now."""
    state = _state(services, name)
    with _store_calls():
        found = await asyncio.to_thread(state.hidden, name)
    now = time.time()
    shown = [
        HiddenInfo(item_id=i, until=h.until, reason=h.reason, hidden_at=h.at)
        for i, h in found.items()
        if h.until is None or h.until > now
    ]
    return HiddenList(name=name, items=sorted(shown, key=lambda h: (-h.hidden_at, h.item_id)))


@contextmanager
def _store_calls(failed: str = "") -> Iterator[None]:
    """A store that does not answer is a 503 saying what was not done."""
    try:
        yield
    except StoreError:
        raise StoreUnavailable(f"store unavailable{': ' + failed if failed else ''}; retry shortly") from None


def _named(name: str, held: dict[str, str]) -> NamedFilters:
    return NamedFilters(name=name, filters={k: json.loads(v) for k, v in sorted(held.items())})


def _state(services: Services, name: str) -> ProductionState:
    if name not in services.loaded.models:
        raise UnknownModel(f"no model {name!r} is served", ["path", "name"])
    if services.state is None:
        raise StoreUnavailable("store unavailable; retry shortly")
    return services.state


async def _refresh(services: Services, name: str) -> None:
    """This worker at once (the others at their next housekeeping tick)."""
    if services.catalog is not None:
        await services.catalog.refresh(services.state, services.loaded, name)


FilterName = Annotated[str, PathParam(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class NamedFilterRequest(Strict):
    expression: dict[str, Any] = Field(
        description='a filter as /recommend takes it, where {"param": "p"} stands for the value a query gives '
        'in "params" (e.g. {"field": "genres", "any_of": {"param": "genres"}}); checked when a query uses it'
    )


class NamedFilters(BaseModel):
    name: str
    filters: dict[str, dict[str, Any]] = Field(description="filter name -> its expression")


async def named_filter_body(request: Request) -> NamedFilterRequest:
    return await parse_body(request, NamedFilterRequest)


@router.put(
    "/admin/models/{name}/filters/{filter_name}",
    response_model=NamedFilters,
    openapi_extra=body_doc("NamedFilterRequest"),
    responses=errors(401, 403, 404, 409, 422, 503),
    dependencies=[AdminKey],
)
async def put_filter(
    services: ServicesDep,
    name: ModelNamePath,
    filter_name: FilterName,
    body: Annotated[NamedFilterRequest, Depends(named_filter_body)],
) -> NamedFilters:
    """Store a named filter of `name`, used by queries as {"name": ..., "params": {...}} (every worker and
    host sharing the store within one housekeeping tick)."""
    state = _state(services, name)
    try:
        # JSON has no NaN or Infinity: stored, they would be listed back as null (another filter) and 422 on use.
        spec = json.dumps(body.expression, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InvalidQuery("the expression holds NaN or Infinity, which JSON has not", ["body", "expression"]) from None
    if len(spec) > MAX_FILTER_BYTES:
        raise InvalidQuery(f"the expression is over {MAX_FILTER_BYTES} bytes of JSON", ["body", "expression"])
    with _store_calls("the filter could not be kept"):
        held = await asyncio.to_thread(state.filters, name)
        if filter_name not in held and len(held) >= MAX_NAMED_FILTERS:
            raise TooManyRules(f"model {name!r} holds {MAX_NAMED_FILTERS} named filters", ["path", "filter_name"])
        await asyncio.to_thread(state.set_filter, name, filter_name, spec)
        held = await asyncio.to_thread(state.filters, name)
    await _refresh(services, name)
    return _named(name, held)


@router.delete(
    "/admin/models/{name}/filters/{filter_name}",
    response_model=NamedFilters,
    responses=errors(401, 403, 404, 503),
    dependencies=[AdminKey],
)
async def delete_filter(services: ServicesDep, name: ModelNamePath, filter_name: FilterName) -> NamedFilters:
    """Remove a named filter of `name`."""
    state = _state(services, name)
    with _store_calls():
        held = await asyncio.to_thread(state.filters, name)
        if filter_name not in held:
            raise UnknownModel(f"model {name!r} has no filter {filter_name!r}", ["path", "filter_name"])
        await asyncio.to_thread(state.set_filter, name, filter_name, None)
        held = await asyncio.to_thread(state.filters, name)
    await _refresh(services, name)
    return _named(name, held)


@router.get("/models/{name}/filters", response_model=NamedFilters, responses=errors(404, 422, 503))
async def list_filters(services: ServicesDep, name: ModelNamePath) -> NamedFilters:
    """The named filters queries of `name` can use."""
    state = _state(services, name)
    with _store_calls():
        held = await asyncio.to_thread(state.filters, name)
    return _named(name, held)
