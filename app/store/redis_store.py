"""Redis store, for several service instances on one Redis (durable with append-only persistence)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

from app.store.base import (
    StoreError,
    event_key,
    json_ts,
    nan_ts,
    redact,
)
from app.store.histories import (
    RECENT_EVENTS,
    RECENT_KEEP_S,
    Event,
    HistoryStore,
    Outcome,
    StoredEvents,
)
from app.store.state import (
    EXPOSURE_BUCKET_S,
    EXPOSURE_KEEP_S,
    ONLINE_KEEP_S,
    WEIGHT_CAP,
    Arrival,
    Candidate,
    Exposure,
    ExposureKey,
    HiddenItem,
    OnlineKey,
    ProductionState,
    RetrainRecord,
    Sums,
    Traffic,
    TrafficKey,
    UserKey,
    UserStats,
    probation_key,
)
from models.queries import LIVE_EVENTS, RecentEvent, Timeline

log = logging.getLogger(__name__)
T = TypeVar("T")


# One call appends many events atomically. First every id's digest is checked (new, same payload, or
# another payload: then nothing is written); then each new event joins its user's sorted set of its
# kind (own events, or received steps; score = time; member = a zero-padded arrival number + payload,
# so equal times keep arrival order), the set is trimmed to `keep`, and an event trimmed at once is
# reported (4: dropped_old). Own events also join the namespace's `recent` set (member = the arrival
# number + [user, item, action]), trimmed to `horizon` seconds before its newest, and the `arrivals`
# stream shared by every namespace (online evaluation; with the answer the event names, if any), capped at
# about `maxlen` entries.
_APPEND_LUA = """
local prefix, keep, rprefix, horizon = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local ns, now, maxlen = ARGV[5], ARGV[6], ARGV[7]
local out, known, conflict, written = {}, {}, false, {}
for n = 8, #ARGV, 8 do
  local id, digest = ARGV[n], ARGV[n + 2]
  local prev = known[id]
  if prev == nil then prev = redis.call('HGET', KEYS[1], id) end
  if not prev then
    known[id] = digest
    out[#out + 1] = 1
  elseif prev == digest or prev == '' then
    out[#out + 1] = 0
  else
    out[#out + 1] = 2
    conflict = true
  end
end
if conflict then
  for i = 1, #out do if out[i] ~= 2 then out[i] = 3 end end
  return out
end
local recent = false
for n = 8, #ARGV, 8 do
  local i = (n - 8) / 8 + 1
  if out[i] == 1 then
    local id, user, digest, score, payload = ARGV[n], ARGV[n + 1], ARGV[n + 2], ARGV[n + 3], ARGV[n + 4]
    redis.call('HSET', KEYS[1], id, digest)
    local seq = string.format('%020d', redis.call('INCR', KEYS[3]))
    local own = ARGV[n + 5] ~= '1'
    local key = (own and prefix or rprefix) .. user
    local member = seq .. payload
    redis.call('ZADD', key, score, member)
    redis.call('ZREMRANGEBYRANK', key, 0, -(keep + 1))
    written[i] = {key, member}
    redis.call('SADD', KEYS[2], user)
    if own then
      redis.call('ZADD', KEYS[4], score, seq .. ARGV[n + 6])
      recent = true
      local item = cjson.decode(payload)[1]
      local fields = {'ns', ns, 'user', user, 'item', item, 'at', now}
      if ARGV[n + 7] ~= '' then fields[#fields + 1] = 'rid'; fields[#fields + 1] = ARGV[n + 7] end
      redis.call('XADD', KEYS[5], 'MAXLEN', '~', maxlen, '*', unpack(fields))
    end
  end
end
if recent then
  local newest = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
  if newest[2] then
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. (tonumber(newest[2]) - horizon))
  end
end
for i, km in pairs(written) do
  if not redis.call('ZSCORE', km[1], km[2]) then out[i] = 4 end
end
return out
"""
# Ends the trial of a candidate version if it still runs (KEYS: candidates, pins; ARGV: name, version,
# promote, the spec with its outcome): 1 when settled, 0 when the candidate had changed or ended.
_SETTLE_LUA = """
local spec = redis.call('HGET', KEYS[1], ARGV[1])
if not spec then return 0 end
local c = cjson.decode(spec)
if c['version'] ~= ARGV[2] or (c['outcome'] ~= nil and c['outcome'] ~= cjson.null) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
if ARGV[3] == '1' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
return 1
"""
# Ends a promotion's probation (KEYS: candidates, pins; ARGV: name, version, the spec written, '1' to pin the
# version it replaced again: a rollback): 1 when the candidate was `version`, promoted, on probation (not
# confirmed), with the version it replaced recorded.
_END_PROBATION_LUA = """
local spec = redis.call('HGET', KEYS[1], ARGV[1])
if not spec then return 0 end
local c = cjson.decode(spec)
if c['version'] ~= ARGV[2] or c['outcome'] ~= 'promoted' or type(c['replaced']) ~= 'string' then return 0 end
if c['confirmed'] ~= nil and c['confirmed'] ~= cjson.null then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] == '1' then redis.call('HSET', KEYS[2], ARGV[1], c['replaced']) end
return 1
"""
# Takes or renews a lease (KEYS: its hash; ARGV: holder, now, until) unless another holder's is current.
_LEASE_LUA = """
local cur = redis.call('HMGET', KEYS[1], 'holder', 'until')
if cur[1] and cur[1] ~= ARGV[1] and tonumber(cur[2]) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'until', ARGV[3])
return 1
"""
# Deletes a lease (KEYS: its hash) when ARGV[1] holds it.
_DROP_LEASE_LUA = """
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""
# Adds per-user sums of one trial (KEYS: its per-user hash, its sides' hash; ARGV: version, variant, the
# user's two field names, lists, score sum, repeated) and moves each side's running sums (UserStats,
# fields "<version>\0<variant>\0<stat>") in the same call. A sides' hash without the "means" mark (made
# before the users' weighted means were kept, or not made yet) is rebuilt from the per-user hash first.
_USER_SUMS_LUA = (
    f"local CAP = {WEIGHT_CAP!r}\n"
    + """
local function sign(x) if x > 0 then return 1 elseif x < 0 then return -1 else return 0 end end
local function weigh(side, k, total, sign)
  if k <= 0 then return end
  local w, m = math.min(k, CAP), total / k
  redis.call('HINCRBYFLOAT', KEYS[2], side .. 'w', sign * w)
  redis.call('HINCRBYFLOAT', KEYS[2], side .. 'wm', sign * w * m)
  redis.call('HINCRBYFLOAT', KEYS[2], side .. 'w2', sign * w * w)
  redis.call('HINCRBYFLOAT', KEYS[2], side .. 'w2m', sign * w * w * m)
  redis.call('HINCRBYFLOAT', KEYS[2], side .. 'w2mm', sign * w * w * m * m)
end
local function move(side, old_n, old_s, new_n, new_s)
  if old_n == nil then redis.call('HINCRBYFLOAT', KEYS[2], side .. 'users', 1); old_n, old_s = 0, 0 end
  redis.call('HINCRBYFLOAT', KEYS[2], side .. 'n', new_n - old_n)
  redis.call('HINCRBYFLOAT', KEYS[2], side .. 's', new_s - old_s)
  weigh(side, old_n, old_s, -1)
  weigh(side, new_n, new_s, 1)
  local was, now = sign(old_s), sign(new_s)
  if was ~= now then
    if was == 1 then redis.call('HINCRBYFLOAT', KEYS[2], side .. 'positive', -1) end
    if was == -1 then redis.call('HINCRBYFLOAT', KEYS[2], side .. 'negative', -1) end
    if now == 1 then redis.call('HINCRBYFLOAT', KEYS[2], side .. 'positive', 1) end
    if now == -1 then redis.call('HINCRBYFLOAT', KEYS[2], side .. 'negative', 1) end
  end
end
if redis.call('HEXISTS', KEYS[2], 'means') == 0 then
  redis.call('DEL', KEYS[2])
  local users = {}
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local f = cjson.decode(all[i])
    local side = f[1] .. '\0' .. f[2] .. '\0'
    local u = users[side .. f[3]] or {side, 0, 0}
    if f[4] == 'n' then u[2] = tonumber(all[i + 1]) else u[3] = tonumber(all[i + 1]) end
    users[side .. f[3]] = u
  end
  for _, u in pairs(users) do if u[2] > 0 then move(u[1], nil, nil, u[2], u[3]) end end
  redis.call('HSET', KEYS[2], 'means', 1)
end
for i = 1, #ARGV, 6 do
  local side, fn, fs = ARGV[i] .. '\0' .. ARGV[i + 1] .. '\0', ARGV[i + 2], ARGV[i + 3]
  local old_n, old_s = redis.call('HGET', KEYS[1], fn), redis.call('HGET', KEYS[1], fs)
  if old_n then old_n, old_s = tonumber(old_n), tonumber(old_s or '0') else old_n, old_s = nil, nil end
  local new_n = tonumber(redis.call('HINCRBYFLOAT', KEYS[1], fn, ARGV[i + 4]))
  local new_s = tonumber(redis.call('HINCRBYFLOAT', KEYS[1], fs, ARGV[i + 5]))
  move(side, old_n, old_s, new_n, new_s)
end
return 1
"""
)
# Entries the arrivals stream keeps, about: minutes of a busy service (each worker reads it every
# SEQSERVE_ONLINE_SCORE_S), a bounded share of Redis memory (docs/decisions/online-evaluation.md).
ARRIVALS_MAX = 200_000
_OUTCOMES: dict[int, Outcome] = {1: "stored", 0: "duplicate", 2: "conflict", 3: "skipped", 4: "dropped_old"}
_SEQ_WIDTH = 20
_DAY_S = 86_400.0


class RedisStore(HistoryStore, ProductionState):
    """Redis store for several instances. Keys, under <prefix><ns>: `seeded` (the data hash whose
    trained events were last dropped),
    `eids` (hash event id -> digest), `live` (set of users), `seq`, `z:<user>` (sorted set of the user's
    own events), `r:<user>` (sorted set of the steps it received), `recent` (every user's own events of
    the last `recent_keep_s`, for recent activity). Under <prefix>: the production state (`pins`,
    `candidates`, `arrivals`, `online:<name>`, `exposure:<name>`, `exposed:<name>:<bucket>` (the items shown),
    `traffic:<name>:<day>`, `trial:<name>:<start>`, `lease:<name>`).

    The append script derives the per-user keys inside it, so this needs one Redis server, not a cluster.
    """

    kind = "redis"

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
    ) -> None:
        import redis

        super().__init__(keep)
        self.recent_keep_s = self.recent_horizon_s = recent_keep_s
        self._redis_errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self.where = redact(url)
        # An append is acknowledged once this many replicas have it (Redis WAIT): without, an event the
        # primary took and then lost with it (kill -9 before its replica read it) is gone after a failover.
        self.wait_replicas, self.wait_timeout_ms = wait_replicas, wait_timeout_ms
        auth = {"password": password} if password else {}
        try:
            self.r = self._connect(url, timeout_s=timeout_s, auth=auth)
        except (ValueError, TypeError, *self._redis_errors) as exc:  # TypeError: an unknown URL parameter
            raise StoreError(f"redis {self.where}: {type(exc).__name__}") from None
        self.prefix = prefix
        self._append = self.r.register_script(_APPEND_LUA)
        self._settle = self.r.register_script(_SETTLE_LUA)
        self._lease = self.r.register_script(_LEASE_LUA)
        self._end_probation = self.r.register_script(_END_PROBATION_LUA)
        self._drop_lease = self.r.register_script(_DROP_LEASE_LUA)
        self._user_sums = self.r.register_script(_USER_SUMS_LUA)

    def _connect(self, url: str, *, timeout_s: float, auth: dict[str, str]) -> Any:
        import redis

        r = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True, **auth
        )
        # The pool makes its connections lazily: one made here (it does not connect) turns an
        # unknown URL parameter into a start-up error instead of a 500 on every store call.
        pool = r.connection_pool
        pool.connection_class(**pool.connection_kwargs).disconnect()
        return r

    def _k(self, namespace: str, what: str) -> str:
        return f"{self.prefix}{namespace}:{what}"

    def _shared(self, what: str) -> str:
        """A key every model shares (pins, candidates)."""
        return f"{self.prefix}{what}"

    def _of_model(self, name: str, what: str, rest: str = "") -> str:
        """A key of model `name`'s production state (its online sums, trials, lease...)."""
        return f"{self.prefix}{what}:{name}{rest}"

    def _acknowledged(self, client: Any, write: Callable[[Any], Any]) -> Any:
        """`write(client)`'s result; when replicas are asked for, the write and a WAIT go on one pipeline
        (one connection: WAIT covers that connection's writes), and fewer replicas acknowledging in time
        is a StoreError. The write stands on the primary either way: a retry of the same events is a
        duplicate."""
        if not self.wait_replicas:
            return write(client)
        pipe = client.pipeline(transaction=False)
        write(pipe)
        pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
        got = pipe.execute()
        if int(got[-1]) < self.wait_replicas:
            raise StoreError(f"redis {self.where}: {got[-1]} of {self.wait_replicas} replicas acknowledged in time")
        return got[0]

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except self._redis_errors as exc:
            # redis-py's messages can repeat the connection URL: keep only the redacted one.
            raise StoreError(f"redis {self.where}: {type(exc).__name__}: {str(exc).split(' redis://')[0]}") from None

    def _migrate(self, namespace: str) -> None:
        """Move a namespace written by the previous version (a list per user, a set of ids) to this layout."""
        old_ids = self._k(namespace, "ids")
        if self.r.type(old_ids) == "set":
            for eid in self.r.sscan_iter(old_ids, count=1000):
                self.r.hsetnx(self._k(namespace, "eids"), eid, "")  # "": any payload counts as a duplicate
            self.r.delete(old_ids)
        live: set[str] = self.r.smembers(self._k(namespace, "live"))
        for user in live:
            old = self._k(namespace, f"ev:{user}")
            if self.r.type(old) != "list":
                continue
            payloads: list[str] = self.r.lrange(old, 0, -1)
            for payload in payloads:
                item, ts = json.loads(payload)[:2]
                seq = self.r.incr(self._k(namespace, "seq"))
                self.r.zadd(
                    self._k(namespace, f"z:{user}"),
                    {f"{seq:0{_SEQ_WIDTH}d}{json.dumps([item, ts, None])}": _score(nan_ts(ts))},
                )
            self.r.delete(old)
        # Earlier versions kept a copy of every artifact history here; the tables hold them now.
        self.r.unlink(self._k(namespace, "base"))

    # -- where a user's keys live (one server: under the namespace; a cluster moves them into buckets) --

    def _user_key(self, namespace: str, user: str, kind: str) -> str:
        """A user's sorted set: `z` its own events, `r` the steps it received."""
        return self._k(namespace, f"{kind}:{user}")

    def _recent_key(self, namespace: str, user: str) -> str:
        """The recent-events set `user`'s own events join."""
        return self._k(namespace, "recent")

    def _live_users(self, namespace: str) -> Iterator[str]:
        """Every user with live events in `namespace` (scanned: the set may be large)."""
        return cast(Iterator[str], self.r.sscan_iter(self._k(namespace, "live"), count=1000))

    def drop_trained_events(self, namespace: str, data_hash: str, stored: StoredEvents) -> int | None:
        def do() -> int | None:
            self._migrate(namespace)
            if self.r.get(self._k(namespace, "seeded")) == data_hash:
                return None
            dropped = 0
            for user in self._live_users(namespace):
                held = stored(user)
                if held:
                    dropped += self._drop_held(namespace, user, held)
            self.r.set(self._k(namespace, "seeded"), data_hash)
            return dropped

        return self._call(do)

    def _drop_held(self, namespace: str, user: str, held: set[tuple[str | None, float | None]]) -> int:
        """Remove `user`'s live events an artifact now holds; -> how many."""
        dropped = 0
        for kind in ("z", "r"):
            key = self._user_key(namespace, user, kind)
            members: list[str] = self.r.zrange(key, 0, -1)
            folded = [m for m in members if event_key(*_decode(m)[:2]) in held]
            if folded:
                # Removing these members only: events appended meanwhile are untouched.
                dropped += int(self.r.zrem(key, *folded))
                if kind == "z":  # own events: now counted from the artifact's log
                    recent = [m[:_SEQ_WIDTH] + _recent_payload(user, i, a) for m in folded for i, _, a in [_decode(m)]]
                    self.r.zrem(self._recent_key(namespace, user), *recent)
        return dropped

    def append(self, namespace: str, events: Sequence[Event]) -> list[Outcome]:
        if not events:
            return []
        keys = [self._k(namespace, what) for what in ("eids", "live", "seq", "recent")] + [self._shared("arrivals")]
        args = self._append_args(namespace, events, prefix=self._k(namespace, ""), arrivals_max=ARRIVALS_MAX)
        codes = self._call(lambda: self._acknowledged(self.r, lambda c: self._append(keys=keys, args=args, client=c)))
        return [_OUTCOMES[int(c)] for c in codes]

    def _append_args(
        self, namespace: str, events: Sequence[Event], *, prefix: str, arrivals_max: int
    ) -> list[str | int | float]:
        """The append script's arguments (_APPEND_LUA): the users' key prefixes under `prefix`, then eight per event."""
        args: list[str | int | float] = [
            f"{prefix}z:",
            self.keep,
            f"{prefix}r:",
            self.recent_keep_s,
            namespace,
            repr(time.time()),
            arrivals_max,
        ]
        for e in events:
            args += [
                e.event_id,
                e.user_id,
                e.digest,
                _score(e.timestamp),
                json.dumps([e.item_id, json_ts(e.timestamp), e.action]),
                int(e.received),
                _recent_payload(e.user_id, e.item_id, e.action),
                e.recommendation_id or "",
            ]
        return args

    def events(self, namespace: str, users: Sequence[str], limit: int | None = None) -> dict[str, Timeline]:
        wanted = list(dict.fromkeys(users))
        if not wanted:
            return {}
        n = min(limit or self.keep, self.keep)

        def do() -> list[Any]:
            pipe = self.r.pipeline(transaction=False)
            for u in wanted:
                pipe.zrange(self._user_key(namespace, u, "z"), -n, -1, withscores=True)
                pipe.zrange(self._user_key(namespace, u, "r"), -n, -1, withscores=True)
            return cast(list[Any], pipe.execute())

        found = self._call(do)
        out: dict[str, Timeline] = {}
        for k, u in enumerate(wanted):
            members = found[2 * k] + found[2 * k + 1]
            if members:
                members.sort(key=lambda ms: (ms[1], ms[0][:_SEQ_WIDTH]))  # time, then arrival
                out[u] = [_decode(m) for m, _ in members]
        return out

    def recent(self, namespace: str, *, start: float, end: float, limit: int = RECENT_EVENTS) -> list[RecentEvent]:
        def do() -> list[tuple[str, float]]:
            return cast(
                list[tuple[str, float]], self._recent_span(self.r, self._k(namespace, "recent"), start, end, limit)
            )

        return _recent_events(self._call(do), namespace, limit)

    @staticmethod
    def _recent_span(client: Any, key: str, start: float, end: float, limit: int) -> Any:
        """The newest `limit` + 1 members of a recent set in [start, end), newest first, with their times."""
        return client.zrevrangebyscore(key, f"({end!r}", repr(float(start)), start=0, num=limit + 1, withscores=True)

    def pending(self, namespace: str) -> int:
        def do() -> int:
            total, pipe = 0, self.r.pipeline(transaction=False)
            for n, user in enumerate(self._live_users(namespace), 1):
                pipe.zcard(self._user_key(namespace, user, "z"))
                if n % 1000 == 0:
                    total += sum(pipe.execute())
            return total + sum(pipe.execute())

        return self._call(do)

    def users(self, namespace: str) -> Iterator[str]:
        def do() -> list[str]:
            return sorted(self._live_users(namespace))

        return iter(self._call(do))

    def pins(self) -> dict[str, str]:
        found = self._call(lambda: self.r.hgetall(self._shared("pins")))
        return {str(k): str(v) for k, v in found.items()}

    def set_pin(self, name: str, version: str | None) -> None:
        key = self._shared("pins")
        self._call(lambda: self.r.hdel(key, name) if version is None else self.r.hset(key, name, version))

    def hide(self, name: str, items: Mapping[str, HiddenItem]) -> int:
        key = self._of_model(name, "hidden")

        def do() -> int:
            pipe = self.r.pipeline(transaction=True)
            pipe.hset(key, mapping={item: h.to_json() for item, h in items.items()})
            pipe.hlen(key)
            return int(pipe.execute()[-1])

        return int(self._call(do))

    def unhide(self, name: str, items: Sequence[str]) -> int:
        key = self._of_model(name, "hidden")
        return int(self._call(lambda: self.r.hdel(key, *items))) if items else 0

    def set_filter(self, name: str, filter_name: str, spec: str | None) -> None:
        key = self._of_model(name, "filters")
        self._call(lambda: self.r.hdel(key, filter_name) if spec is None else self.r.hset(key, filter_name, spec))

    def filters(self, name: str) -> dict[str, str]:
        found = self._call(lambda: self.r.hgetall(self._of_model(name, "filters")))
        return {str(k): str(v) for k, v in found.items()}

    def hidden(self, name: str) -> dict[str, HiddenItem]:
        found = self._call(lambda: self.r.hgetall(self._of_model(name, "hidden")))
        return {str(item): HiddenItem.from_json(spec) for item, spec in found.items()}

    def first_cursor(self, since: float) -> str:
        # A stream id is the server's milliseconds: the entries at or after `since` follow this one.
        return f"{max(0, int(since * 1000) - 1)}-{2**64 - 1}"

    def arrivals(self, cursor: str | None, limit: int = 10_000) -> tuple[str, list[Arrival]]:
        key = self._shared("arrivals")
        Entries = list[tuple[str, dict[str, str]]]  # decode_responses=True: every id and field is a str
        if cursor is None:
            last = cast(Entries, self._call(lambda: self.r.xrevrange(key, count=1)))
            return (last[0][0] if last else "0-0"), []
        found = cast(Entries, self._call(lambda: self.r.xrange(key, min=f"({cursor}", max="+", count=limit)))
        out = [Arrival(f["ns"], f["user"], f["item"], float(f["at"]), f.get("rid")) for _, f in found]
        return (found[-1][0] if found else cursor), out

    def add_online(self, sums: Mapping[OnlineKey, Sums]) -> None:
        if not sums:
            return

        def do() -> None:
            pipe = self.r.pipeline(transaction=True)
            for (name, version, variant, bucket, segment), s in sums.items():
                for metric, value in zip(Sums.FIELDS, s.values(), strict=True):
                    pipe.hincrbyfloat(
                        self._of_model(name, "online"), f"{version}|{variant}|{bucket:.0f}|{segment}|{metric}", value
                    )
            pipe.execute()
            for name in {key[0] for key in sums}:
                self._drop_buckets(self._of_model(name, "online"), before=time.time() - ONLINE_KEEP_S)

        self._call(do)

    def online(self, name: str) -> dict[OnlineKey, Sums]:
        found = self._call(lambda: self.r.hgetall(self._of_model(name, "online")))
        out: dict[OnlineKey, Sums] = {}
        for field_name, value in found.items():
            parts = str(field_name).split("|")
            if len(parts) == 4:  # written before the segments: segment ""
                parts.insert(3, "")
            version, variant, bucket, segment, metric = parts
            sums = out.setdefault((name, version, variant, float(bucket), segment), Sums())
            setattr(sums, metric, float(value))
        return out

    def _drop_buckets(self, key: str, *, before: float) -> None:
        """Drop the fields of the hash `key` (version|variant|bucket|...) whose bucket starts before `before`."""
        old = [f for f in cast(list[str], self.r.hkeys(key)) if _bucket(f) < before]
        if old:
            self.r.hdel(key, *old)

    def _exposed(self, name: str, bucket: float) -> str:
        """The set of `version|variant|item` shown in one exposure bucket of model `name`."""
        return self._of_model(name, "exposed", f":{bucket:.0f}")

    def add_exposure(self, rows: Mapping[ExposureKey, Exposure]) -> None:
        if not rows:
            return

        def do() -> None:
            pipe = self.r.pipeline(transaction=True)
            for (name, version, variant, bucket), e in rows.items():
                head = f"{version}|{variant}|{bucket:.0f}|"
                for metric, value in (("lists", e.lists), ("slots", e.slots), ("head", e.head)):
                    pipe.hincrbyfloat(self._of_model(name, "exposure"), f"{head}{metric}", value)
                if e.items:
                    key = self._exposed(name, bucket)
                    pipe.sadd(key, *(f"{version}|{variant}|{item}" for item in e.items))
                    pipe.expire(key, int(EXPOSURE_KEEP_S))
            pipe.execute()
            for name in {key[0] for key in rows}:
                self._drop_buckets(self._of_model(name, "exposure"), before=time.time() - EXPOSURE_KEEP_S)

        self._call(do)

    def exposure(self, name: str, *, since: float) -> dict[tuple[str, str], Exposure]:
        # The buckets that end after `since`, up to the one after now's (hosts' clocks differ).
        first = math.floor(since / EXPOSURE_BUCKET_S)
        buckets = [b * EXPOSURE_BUCKET_S for b in range(first, math.floor(time.time() / EXPOSURE_BUCKET_S) + 2)]

        def do() -> list[Any]:
            pipe = self.r.pipeline(transaction=False)
            pipe.hgetall(self._of_model(name, "exposure"))
            for b in buckets:
                pipe.smembers(self._exposed(name, b))
            return cast(list[Any], pipe.execute())

        counts, *members = self._call(do)
        out: dict[tuple[str, str], Exposure] = {}
        for field_name, value in cast(dict[str, str], counts).items():
            version, variant, bucket, metric = field_name.split("|")
            if float(bucket) >= buckets[0]:
                e = out.setdefault((version, variant), Exposure())
                setattr(e, metric, getattr(e, metric) + float(value))
        for found in members:
            for member in cast(set[str], found):
                version, variant, item = member.split("|", 2)
                out.setdefault((version, variant), Exposure()).items.add(item)
        return out

    def add_traffic(self, rows: Mapping[TrafficKey, Traffic]) -> None:
        if not rows:
            return

        def do() -> None:
            pipe = self.r.pipeline(transaction=True)
            for (name, version, bucket), t in rows.items():
                key, head = self._traffic(name, bucket), f"{version}|{bucket:.0f}|"
                pipe.hincrbyfloat(key, f"{head}n", t.n)
                pipe.hincrbyfloat(key, f"{head}errors", t.errors)
                for i, count in t.hist.items():
                    pipe.hincrbyfloat(key, f"{head}h{i}", count)
                pipe.expire(key, int(ONLINE_KEEP_S + _DAY_S))  # a day's hash goes as a whole once past the keep
            pipe.execute()

        self._call(do)

    def traffic(self, name: str, *, since: float) -> dict[TrafficKey, Traffic]:
        # The day hashes from `since` to tomorrow (hosts' clocks differ), then their minutes from `since` on.
        days = range(int(since // _DAY_S), int(time.time() // _DAY_S) + 2)

        def do() -> list[dict[str, str]]:
            pipe = self.r.pipeline(transaction=False)
            for day in days:
                pipe.hgetall(self._traffic(name, day * _DAY_S))
            return cast(list[dict[str, str]], pipe.execute())

        out: dict[TrafficKey, Traffic] = {}
        for found in self._call(do):
            for field_name, value in found.items():
                version, bucket, metric = str(field_name).split("|")
                if float(bucket) < since:
                    continue
                t = out.setdefault((name, version, float(bucket)), Traffic())
                if metric.startswith("h"):
                    t.hist[int(metric[1:])] = float(value)
                else:
                    setattr(t, metric, float(value))
        return out

    def _traffic(self, name: str, bucket: float) -> str:
        """The hash of `name`'s traffic on the UTC day of `bucket`: a read covers only the days it asks for."""
        return self._of_model(name, "traffic", f":{int(bucket // _DAY_S)}")

    def add_user_sums(self, sums: Mapping[UserKey, Sequence[float]]) -> None:
        per_trial: dict[tuple[str, float], list[str | float]] = {}
        for (name, trial, version, variant, user), (n, ndcg) in sums.items():
            fields = [json.dumps([version, variant, user, metric]) for metric in ("n", "ndcg")]
            per_trial.setdefault((name, trial), []).extend([version, variant, *fields, float(n), float(ndcg)])

        def do() -> None:
            for (name, trial), args in per_trial.items():
                self._user_sums(keys=[self._trial(name, trial), self._trial(name, trial, "sides")], args=args)

        if sums:
            self._call(do)

    def trial_stats(self, name: str, trial: float) -> dict[tuple[str, str], UserStats]:
        found = self._call(lambda: self.r.hgetall(self._trial(name, trial, "sides")))
        out: dict[tuple[str, str], UserStats] = {}
        for field_name, value in found.items():
            parts = str(field_name).split("\0")
            if len(parts) != 3 or parts[2] not in UserStats.FIELDS:  # the "means" mark
                continue
            version, variant, stat = parts
            got = out.setdefault((version, variant), UserStats())
            setattr(got, stat, round(float(value)) if stat in UserStats.COUNTS else float(value))
        return out

    def _trial(self, name: str, trial: float, what: str = "") -> str:
        """A trial's per-user hash (its sides' running sums: `what` = "sides")."""
        return self._of_model(name, f"trial{what}", f":{trial!r}")

    def _trial_patterns(self, name: str) -> tuple[str, ...]:
        """Key patterns matching every trial key of model `name`."""
        return self._of_model(name, "trial", ":*"), self._of_model(name, "trialsides", ":*")

    def candidates(self) -> dict[str, Candidate]:
        found = self._call(lambda: self.r.hgetall(self._shared("candidates")))
        return {str(k): Candidate.from_json(str(v)) for k, v in found.items()}

    def set_candidate(self, name: str, candidate: Candidate | None) -> None:
        key = self._shared("candidates")
        trials = [candidate.since] if candidate else []
        if (promoted := probation_key(cast(str | None, self._call(lambda: self.r.hget(key, name))))) >= 0:
            trials.append(promoted)
        keep = {self._trial(name, t, kind) for t in trials for kind in ("", "sides")}

        def do() -> None:
            for pattern in self._trial_patterns(name):
                for old in self.r.scan_iter(pattern, count=100):
                    if old not in keep:
                        self.r.unlink(old)
            if candidate is None:
                self.r.hdel(key, name)
            else:
                self.r.hset(key, name, candidate.to_json())

        self._call(do)

    def settle(self, name: str, version: str, *, promote: bool) -> bool:
        keys = [self._shared("candidates"), self._shared("pins")]
        spec = self._call(lambda: self.r.hget(keys[0], name))
        if spec is None:
            return False
        pin = self._call(lambda: self.r.hget(keys[1], name)) if promote else None  # stable while the trial runs
        ended = Candidate.from_json(str(spec)).settled(
            promoted=promote, at=time.time(), replaced=None if pin is None else str(pin)
        )
        return bool(self._call(lambda: self._settle(keys=keys, args=[name, version, int(promote), ended.to_json()])))

    def roll_back(self, name: str, version: str) -> bool:
        return self._end(name, version, lambda c: c.rolled_back(), pin=True)

    def confirm(self, name: str, version: str) -> bool:
        return self._end(name, version, lambda c: c.confirmed_at(time.time()), pin=False)

    def _end(self, name: str, version: str, ended: Callable[[Candidate], Candidate], *, pin: bool) -> bool:
        """End the probation of `version` of `name` with the record `ended` makes (the script checks it runs)."""
        keys = [self._shared("candidates"), self._shared("pins")]
        spec = self._call(lambda: self.r.hget(keys[0], name))
        if spec is None:
            return False
        new = ended(Candidate.from_json(str(spec))).to_json()
        return bool(self._call(lambda: self._end_probation(keys=keys, args=[name, version, new, int(pin)])))

    def retrain_record(self, name: str) -> RetrainRecord:
        spec = self._call(lambda: self.r.hget(self._shared("retrains"), name))
        return RetrainRecord.from_json(str(spec)) if spec is not None else RetrainRecord()

    def set_retrain_record(self, name: str, record: RetrainRecord) -> None:
        self._call(lambda: self.r.hset(self._shared("retrains"), name, record.to_json()))

    def take_lease(self, name: str, holder: str, *, ttl_s: float, now: float) -> bool:
        key = self._of_model(name, "lease")
        return bool(self._call(lambda: self._lease(keys=[key], args=[holder, repr(now), repr(now + ttl_s)])))

    def drop_lease(self, name: str, holder: str) -> None:
        self._call(lambda: self._drop_lease(keys=[self._of_model(name, "lease")], args=[holder]))

    def reloads(self) -> int:
        return int(self._call(lambda: self.r.get(self._shared("reloads"))) or 0)

    def add_reload(self) -> int:
        return int(self._call(lambda: self.r.incr(self._shared("reloads"))))

    def expire(self, *, now: float) -> None:
        """Nothing: the append script caps the arrivals stream (ARRIVALS_MAX) and the recent set on each write."""

    def ping(self) -> None:
        self._call(self.r.ping)

    def close(self) -> None:
        self.r.close()


def _bucket(field_name: str) -> float:
    return float(field_name.split("|")[2])


def _recent_events(found: Sequence[tuple[str, float]], namespace: str, limit: int) -> list[RecentEvent]:
    """Recent-set members, newest first (at most `limit` + 1), as the oldest-first events of the newest `limit`."""
    if len(found) > limit:
        log.warning("recent activity: more than %d live events in %s; the newest %d counted", limit, namespace, limit)
    out: list[RecentEvent] = []
    for member, t in reversed(found[:limit]):
        user, item, action = json.loads(member[_SEQ_WIDTH:])
        out.append((str(user), str(item), float(t), action))
    return out


def _recent_payload(user: str, item: str, action: str | None) -> str:
    return json.dumps([user, item, action])


def _score(t: float) -> str:
    return "-inf" if math.isnan(t) else repr(float(t))


def _decode(member: str) -> tuple[str, float, str | None]:
    item, ts, action = json.loads(member[_SEQ_WIDTH:])
    return str(item), nan_ts(ts), action
