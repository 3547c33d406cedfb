"""What the model routers share: limits from the settings and picking the served model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from fastapi import Request

from app.errors import LimitExceeded, ModelUnavailable, StoreUnavailable, UnknownModel
from app.settings import Settings
from app.store import HistoryStore

T = TypeVar("T")


class HasKAndHistory(Protocol):
    k: int

    @property
    def history(self) -> Sequence[object] | None: ...


def enforce_limits(settings: Settings, queries: Sequence[HasKAndHistory]) -> None:
    """422 naming the field when a request exceeds a configured limit."""
    if len(queries) > settings.max_queries:
        raise LimitExceeded(f"at most {settings.max_queries} queries per request", ["body", "queries"])
    for n, q in enumerate(queries):
        if q.k > settings.max_k:
            raise LimitExceeded(f"k must be at most {settings.max_k}", ["body", "queries", n, "k"])
        if q.history and len(q.history) > settings.max_history:
            raise LimitExceeded(
                f"at most {settings.max_history} history events per query", ["body", "queries", n, "history"]
            )


def pick(served: Mapping[str, T], broken: Mapping[str, str], name: str | None, default: str | None,
         what: str) -> tuple[str, T]:
    """The model a request names, else the default; 404 for an unknown name, 503 for a broken one."""
    name = name or default
    if name is None:
        raise ModelUnavailable(f"no {what} model is loaded", ["body", "model"])
    model = served.get(name)
    if model is None:
        if name in broken:
            raise ModelUnavailable(f"model {name!r} failed to load: {broken[name]}", ["body", "model"])
        raise UnknownModel(f"unknown {what} model {name!r}; loaded: {sorted(served)}", ["body", "model"])
    return name, model


def history_store(request: Request) -> HistoryStore:
    """The store, or 503 naming why it is unavailable."""
    store: HistoryStore | None = request.app.state.store
    if store is None:
        raise StoreUnavailable(f"history store unavailable: {request.app.state.store_error}")
    return store

