"""What a served query is made of, without torch: the live events the history store hands an engine, the
errors an engine raises at a query, and the bounds the service's settings default to. The store, the
settings and the error handler read these, so a process that only stores events or starts workers never
imports torch (models/engine.py is the protocol that uses them)."""

from __future__ import annotations

# A user's live events from the store: (raw id, unix time or NaN, action or None), oldest first.
LiveEvent = tuple[str, float, str | None]
Timeline = list[LiveEvent]
# Any user's live event in a namespace: (actor's raw id, target's raw id, unix time, action or None).
RecentEvent = tuple[str, str, float, str | None]


class QueryError(ValueError):
    """A query the engine cannot answer, naming the query and its field (a client error)."""

    status = 422
    code = "invalid_query"

    def __init__(self, message: str, *, position: int, field: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.position, self.field = position, field

    @property
    def loc(self) -> list[str | int]:
        return ["body", "queries", self.position, *self.field]


class ItemQueryError(QueryError):
    """A bad single-item query (POST /similar-items): its place is in the body itself, not a list of queries."""

    @property
    def loc(self) -> list[str | int]:
        return ["body", *self.field]


class UnknownItemError(ItemQueryError):
    status = 404
    code = "unknown_item"

    def __init__(self, item_id: str) -> None:
        super().__init__(
            f"unknown item {item_id!r}: the model has no neighbours for it", position=0, field=("item_id",)
        )


class UnknownUserError(QueryError):
    status = 404
    code = "unknown_user"

    def __init__(self, user_id: str, position: int) -> None:
        super().__init__(f"unknown user {user_id!r} and no history given", position=position, field=("user_id",))
        self.user_id = user_id


LIVE_EVENTS = 1000  # live events kept and read per user unless the settings say otherwise
# Catalogs from this size on are ranked on the CPU from bfloat16 scores, certified exact, where that is
# faster at load (models/coarse.py): below it the coarse pass does not pay.
COARSE_FROM = 65_536
