"""Domain errors and the status, code and headers each one answers with, in one place.

Framework-free and a leaf (it imports nothing of the app): the serving layer and the loaded models raise
these; `app.handlers` renders every one of them, and the batcher's and store's own errors (its
ERROR_TABLE), as the one JSON error shape.
"""

from __future__ import annotations

from typing import Any

RETRY = {"Retry-After": "1"}


class DomainError(Exception):
    status = 400
    code = "bad_request"
    headers: dict[str, str] | None = None

    def __init__(
        self, message: str, loc: list[str | int] | None = None, details: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.details = details


class UnknownModel(DomainError):
    status, code = 404, "unknown_model"


class ModelUnavailable(DomainError):
    status, code = 503, "model_unavailable"


class Unauthorized(DomainError):
    status, code = 401, "unauthorized"


class Forbidden(DomainError):
    status, code = 403, "forbidden"


class StoreUnavailable(DomainError):
    status, code, headers = 503, "store_unavailable", RETRY


class EventConflict(DomainError):
    """An event_id already stored with a different payload."""

    status, code = 409, "event_conflict"


class InvalidEvents(DomainError):
    """Events a model cannot take (a social model's actions); the details name each one."""

    status, code = 422, "invalid_events"


class UnknownUser(DomainError):
    status, code = 404, "unknown_user"


class InvalidQuery(DomainError):
    """A query parameter the schema cannot check (a field the model does not have, a model without histories)."""

    status, code = 422, "invalid_query"


class NoOlderVersion(DomainError):
    """A rollback with no older version on disk to go to."""

    status, code = 409, "no_older_version"


class NoTrial(DomainError):
    """A candidate call that needs a trial in the state it is not in (none running, or the live version)."""

    status, code = 409, "no_trial"


class BrokenVersion(DomainError):
    """A version asked to serve (pin, rollback, candidate) does not load: nothing was changed."""

    status, code = 409, "broken_version"


class TooManyRules(DomainError):
    """The call would take a model past the hidden items or named filters it may hold."""

    status, code = 409, "too_many_rules"
