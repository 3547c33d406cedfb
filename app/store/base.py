"""What both store interfaces share: the store's error, its lifecycle, and small helpers."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from urllib.parse import urlsplit, urlunsplit


class StoreError(RuntimeError):
    """The store could not be reached or refused a write: nothing of the call was stored.

    The message is for logs (it may name a file or host); clients get a fixed one.
    """


# Query parameters of a Redis URL that carry no secret; every other value (password=..., which
# redis-py accepts, or anything a later client version reads) is masked in logs.
_PLAIN_PARAMS = frozenset(
    {
        "db",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "retry_on_timeout",
        "health_check_interval",
        "protocol",
        "decode_responses",
        "ssl_cert_reqs",
        "client_name",
    }
)


def redact(url: str) -> str:
    """A URL without its password (in the user part or the query string), for logs."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{port}" if port else "")
    query = (
        "&".join(
            p if p.split("=", 1)[0].lower() in _PLAIN_PARAMS or "=" not in p else f"{p.split('=', 1)[0]}=***"
            for p in parts.query.split("&")
        )
        if parts.query
        else ""
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def nan_ts(t: float | None) -> float:
    return math.nan if t is None else float(t)


def json_ts(t: float) -> float | None:
    return None if math.isnan(t) else t


def event_key(item: str, t: float) -> tuple[str | None, float | None]:
    return item, json_ts(t)


class Store(ABC):
    """A store's connection: what readiness pings and shutdown closes, whichever interface it serves."""

    kind: str

    @abstractmethod
    def ping(self) -> None:
        """Raise StoreError when the store cannot be used."""

    @abstractmethod
    def close(self) -> None: ...
