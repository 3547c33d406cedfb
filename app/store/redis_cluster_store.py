"""Redis Cluster store: the Redis store's contract on a cluster, its keys hash-tagged so that every
script and transaction touches one slot (docs/decisions/redis-cluster.md).

Users are spread over `buckets` hash tags by a stable hash of the user id. One bucket holds, for each
namespace, its users' events (`z:<user>`, `r:<user>`), their event ids, the set of its users, its
arrival counter and its recent events, and one arrivals stream shared by the namespaces: the append
script of the single-server store runs unchanged on each bucket, atomically. A call whose events fall
in several buckets is checked first (every id against its bucket, read only) and written only when no
id conflicts, so a conflict still stores nothing of the call; the writes are then atomic per bucket.
Pins, candidates, online sums, exposure, traffic and leases share one tag (a few small keys, written on
housekeeping ticks, and the transactions that move them stay atomic); each trial has its own.

An event id is checked against the ids of its user's bucket: the same id sent for two users in
different buckets is two events here, where one server refuses the second as a conflict.
"""

from __future__ import annotations

import heapq
import logging
import zlib
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, cast

from app.store.base import StoreError
from app.store.histories import RECENT_EVENTS, RECENT_KEEP_S, Event, Outcome
from app.store.redis_store import _OUTCOMES, ARRIVALS_MAX, RedisStore, _recent_events
from app.store.state import Arrival
from models.queries import LIVE_EVENTS, RecentEvent

log = logging.getLogger(__name__)
BUCKETS = 64  # a few per primary even on a large cluster, so that the users spread evenly


class RedisClusterStore(RedisStore):
    kind = "redis-cluster"

    def __init__(
        self,
        url: str,
        prefix: str = "seqserve:",
        timeout_s: float = 5.0,
        keep: int = LIVE_EVENTS,
        password: str | None = None,
        recent_keep_s: float = RECENT_KEEP_S,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        buckets: int = BUCKETS,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise StoreError("redis cluster: the key prefix may not hold { or }: they choose a key's slot")
        if buckets < 1:
            raise StoreError("redis cluster: at least one bucket")
        self.buckets = buckets
        super().__init__(
            url,
            prefix,
            timeout_s,
            keep,
            password,
            recent_keep_s,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
        )

    def _connect(self, url: str, *, timeout_s: float, auth: dict[str, str]) -> Any:
        from redis.cluster import RedisCluster
        from redis.exceptions import RedisClusterException

        # redis-py's cluster errors outside RedisError (no node reachable, no agreement on the slots)
        self._redis_errors = (*self._redis_errors, RedisClusterException)

        # Unlike one server's client, this one reads the slot map when built: a cluster that cannot be
        # reached at the start is a StoreError then (the service starts without its store, /readyz says
        # so); once built, the client follows failovers and slots that move.
        return RedisCluster.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            decode_responses=True,
            require_full_coverage=False,
            **auth,
        )

    # -- where each key lives ------------------------------------------------------------------------

    def bucket(self, user: str) -> int:
        """The bucket of `user`: a hash every process agrees on (not Python's, which is salted)."""
        return zlib.crc32(user.encode()) % self.buckets

    def _b(self, b: int, what: str) -> str:
        """A key of bucket `b` (its hash tag first: every key of a bucket is in one slot)."""
        return f"{{{self.prefix}b{b}}}{what}"

    def _k(self, namespace: str, what: str) -> str:  # per-namespace keys outside the buckets (`seeded`)
        return f"{self.prefix}{namespace}:{what}"

    def _shared(self, what: str) -> str:
        return f"{{{self.prefix}state}}{what}"

    def _of_model(self, name: str, what: str, rest: str = "") -> str:
        return f"{{{self.prefix}state}}{what}:{name}{rest}"

    def _trial(self, name: str, trial: float, what: str = "") -> str:
        return f"{{{self.prefix}trial:{name}:{trial!r}}}{what}"

    def _trial_patterns(self, name: str) -> tuple[str, ...]:
        return (f"{{{self.prefix}trial:{name}:*",)

    def _node_client(self, key: str) -> Any:
        """A client of the primary serving `key` now (WAIT must follow the write on its connection)."""
        return self.r.get_redis_connection(self.r.get_node_from_key(key))

    def _with_topology(self, fn: Callable[[], Any]) -> Any:
        """`fn`, once more after the client re-reads the cluster's nodes when a node it used is gone or
        a slot moved (a failover): the writes it retries are idempotent by event id. A write sent to one
        node's own connection (for WAIT) passes by the cluster client's own redirects, so this is its."""
        from redis.exceptions import ConnectionError, MovedError, RedisClusterException, TimeoutError

        unreachable: tuple[type[BaseException], ...] = (RedisClusterException, *self._redis_errors)
        try:
            return fn()
        except (ConnectionError, TimeoutError, MovedError):
            try:
                self.r.nodes_manager.initialize()
            except unreachable as exc:  # no node answered: the call fails
                log.warning("redis cluster: the nodes could not be read again: %s: %s", type(exc).__name__, exc)
            return fn()

    # -- histories -----------------------------------------------------------------------------------

    def _migrate(self, namespace: str) -> None:
        """Nothing: no earlier layout was ever written to a cluster."""

    def append(self, namespace: str, events: Sequence[Event]) -> list[Outcome]:
        if not events:
            return []
        groups: dict[int, list[int]] = {}
        for i, e in enumerate(events):
            groups.setdefault(self.bucket(e.user_id), []).append(i)
        if len(groups) > 1 and (refused := self._conflicts(namespace, events, groups)) is not None:
            return refused
        out: list[Outcome] = ["skipped"] * len(events)
        for b, members in groups.items():
            codes = self._call(partial(self._append_bucket, namespace, b, events, members))
            for i, code in zip(members, codes, strict=True):
                out[i] = _OUTCOMES[int(code)]
        return out

    def _conflicts(self, namespace: str, events: Sequence[Event], groups: dict[int, list[int]]) -> list[Outcome] | None:
        """The outcomes of a call refused for a conflicting id (as the script would give them), or None."""

        def read() -> list[Any]:
            pipe = self.r.pipeline(transaction=False)
            for b, members in groups.items():
                pipe.hmget(self._b(b, f"{namespace}:eids"), [events[i].event_id for i in members])
            return cast(list[Any], pipe.execute())

        stored: dict[str, str | None] = {}
        for (_, members), digests in zip(groups.items(), self._call(read), strict=True):
            for i, d in zip(members, digests, strict=True):
                stored[events[i].event_id] = d
        seen: dict[str, str] = {}
        conflict = [False] * len(events)
        for i, e in enumerate(events):
            prev = seen.get(e.event_id, stored[e.event_id])
            if prev is None:
                seen[e.event_id] = e.digest
            elif prev not in (e.digest, ""):
                conflict[i] = True
        if not any(conflict):
            return None
        return ["conflict" if c else "skipped" for c in conflict]

    def _append_bucket(self, namespace: str, b: int, events: Sequence[Event], members: list[int]) -> list[Any]:
        keys = [self._b(b, f"{namespace}:{what}") for what in ("eids", "live", "seq", "recent")]
        keys.append(self._b(b, "arrivals"))
        part = [events[i] for i in members]
        args = self._append_args(
            namespace, part, prefix=self._b(b, f"{namespace}:"), arrivals_max=max(1, ARRIVALS_MAX // self.buckets)
        )
        return cast(
            list[Any],
            self._with_topology(
                lambda: self._acknowledged(
                    self._node_client(keys[0]) if self.wait_replicas else self.r,
                    lambda c: self._append(keys=keys, args=args, client=c),
                )
            ),
        )

    def _user_key(self, namespace: str, user: str, kind: str) -> str:
        return self._b(self.bucket(user), f"{namespace}:{kind}:{user}")

    def _recent_key(self, namespace: str, user: str) -> str:
        return self._b(self.bucket(user), f"{namespace}:recent")

    def _live_users(self, namespace: str) -> Iterator[str]:
        for b in range(self.buckets):
            yield from self.r.sscan_iter(self._b(b, f"{namespace}:live"), count=1000)

    def recent(self, namespace: str, *, start: float, end: float, limit: int = RECENT_EVENTS) -> list[RecentEvent]:
        def do() -> list[Any]:
            pipe = self.r.pipeline(transaction=False)
            for b in range(self.buckets):
                self._recent_span(pipe, self._b(b, f"{namespace}:recent"), start, end, limit)
            return cast(list[Any], pipe.execute())

        # Each bucket's newest first; merged, the newest of them all (equal times: any order).
        merged = list(heapq.merge(*self._call(do), key=lambda ms: -ms[1]))
        return _recent_events(merged[: limit + 1], namespace, limit)

    # -- arrivals: one stream per bucket ---------------------------------------------------------------

    def first_cursor(self, since: float) -> str:
        return ",".join([super().first_cursor(since)] * self.buckets)

    def arrivals(self, cursor: str | None, limit: int = 10_000) -> tuple[str, list[Arrival]]:
        """A cursor is every bucket's stream position, comma-separated; the buckets' arrivals are merged
        by their time, each bucket's (so each user's) in its own order."""
        Entries = list[tuple[str, dict[str, str]]]
        keys = [self._b(b, "arrivals") for b in range(self.buckets)]
        if cursor is None:

            def ends() -> list[Any]:
                pipe = self.r.pipeline(transaction=False)
                for key in keys:
                    pipe.xrevrange(key, count=1)
                return cast(list[Any], pipe.execute())

            return ",".join(e[0][0] if e else "0-0" for e in self._call(ends)), []
        at = cursor.split(",")
        if len(at) != self.buckets:
            raise StoreError(f"redis cluster: a cursor of {len(at)} buckets, {self.buckets} configured")

        def read() -> list[Any]:
            pipe = self.r.pipeline(transaction=False)
            for key, pos in zip(keys, at, strict=True):
                pipe.xrange(key, min=f"({pos}", max="+", count=limit)
            return cast(list[Any], pipe.execute())

        found = cast(list[Entries], self._call(read))
        tagged = [[(float(f["at"]), b, eid, f) for eid, f in entries] for b, entries in enumerate(found)]
        taken = list(heapq.merge(*tagged, key=lambda x: x[0]))[:limit]
        for _, b, eid, _ in taken:
            at[b] = eid  # each bucket's entries come in order: its last one taken is where it goes on
        out = [Arrival(f["ns"], f["user"], f["item"], t, f.get("rid")) for t, _, _, f in taken]
        return ",".join(at), out

    def expire(self, *, now: float) -> None:
        """Nothing: each bucket's append caps its arrivals stream and its recent set."""
