"""Hostile clients against a running service: how long /healthz waits, and what the server holds.

    git worktree add ../head <commit> && ln -s "$PWD/.venv" ../head/.venv     # the code before a change
    .venv/bin/python -m bench.serving.hostile --model sasrec-ml100k --root ../head --out runs/hostile-head.json
    .venv/bin/python -m bench.serving.hostile --model sasrec-ml100k --out runs/hostile.json

Each attack runs alone against one server (started from --root's checkout and .venv) while a probe
sends GET /healthz every 10 ms on its own connection; the probe's longest wait is the event loop's
longest stall. Resident memory of the server is sampled every 50 ms (peak during, and 2 s after).
  keys       a /recommend body of 14.4 MB: one query with 1.6 million unknown keys
  steps      a /recommend body of 16.7 MB: 1,024 queries x 1,020 history steps (1,044,480 in all)
  keys-under-budget  one query with 405,000 unknown keys: about the most that passes the value count
  legit-max  a valid body at the default MAX_TOTAL_ITEMS (1,000 queries x 100 steps), answered 200
  big-header two connections each sending a never-ending header, up to 256 MB each
  64mb-header one complete 64 MB header on GET /healthz
  slow       idle, partial-header, partial-body and unfinished-chunked connections: still open at --slow-s?
  many       3,000 connections each holding a half-sent header: descriptors held after 1 s and at --slow-s
  bodies-in-flight  150 connections from one client, each a 16 MB body but its last byte (--bodies)
  half-open  1,024 half-sent headers from 127.0.0.2, then what new connections from 127.0.0.1 and from
             127.0.0.2 get for /healthz, /readyz and /recommend (--half-open)
  reserve    five addresses (127.0.0.2-6) each keep --reserve-per half-sent headers open, reconnecting as
             the server closes them (past the 1,024 cap); meanwhile 20 health checks on new connections
             from 127.0.0.1 and 20 from 127.0.0.2: how many got 200
  number-filter  64 queries, each {"any": [63 x {"field": "release_year", "any_of": [year]}]}, every filter
             distinct (200 KB): past the request's filter work (a 422 now; it froze a worker 4.7 s)
  number-filter-max  as much of that as one request may hold: 4 distinct such filters over 64 queries (200)
  between-63 one query of {"any": [63 x {"field": "release_year", "between": [y, y + 1]}]}
  filter-fill  --fill requests one after another, each with its own filter of 120 values of 250 characters
             (the most a filter's bytes allow): what the filter cache holds against its 64 MiB bound
  long-values  30 requests, each with one filter of 1,000 distinct 15 KB strings (refused now)
  abandoned  two 1,024-query /next-location requests whose clients leave halfway through the first one's
             model time, then a small request:
             how long it waits, and how many of the 2,048 queries the model still computed
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson

from bench.servers import ROOT, rss_mb, start_server, stop


class _Sampler:
    """Calls `tick()` every `every` seconds in a thread, from `with` to its end."""

    every = 0.05

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tick()
            time.sleep(self.every)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Probe(_Sampler):
    """GET /healthz every 10 ms on one kept-alive connection; the longest answer while running."""

    every = 0.01

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url, self.worst, self.failed = url, 0.0, 0
        self.client = httpx.Client(timeout=60)

    def tick(self) -> None:
        t0 = time.perf_counter()
        try:
            self.client.get(f"{self.url}/healthz")
        except httpx.HTTPError:
            self.failed += 1
        self.worst = max(self.worst, time.perf_counter() - t0)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.client.close()


class Memory(_Sampler):
    """The server's resident memory every 50 ms: the peak while running."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid, self.peak, self.before = pid, 0.0, rss_mb(pid)

    def tick(self) -> None:
        self.peak = max(self.peak, rss_mb(self.pid))


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=120)


def _read_status(s: socket.socket) -> tuple[int, int]:
    """(status, bytes of the answer) read until the server closes or a whole answer has come."""
    data = b""
    try:
        while chunk := s.recv(1 << 20):
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep and b"content-length:" in head.lower():
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    break
    except OSError:
        pass
    return (int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0), len(data)


def post_body(port: int, body: bytes) -> dict[str, Any]:
    t0 = time.perf_counter()
    with _connect(port) as s:
        s.sendall(
            b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        status, size = _read_status(s)
    return {"status": status, "answer_bytes": size, "seconds": round(time.perf_counter() - t0, 3)}


def _base36(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + out
        if not n:
            return out


def keys_body() -> bytes:
    """1.6 million unknown keys, short enough to fit under the default 16 MiB body limit."""
    query: dict[str, Any] = {"user_id": "1"}
    query.update({_base36(i): 0 for i in range(1_600_000)})
    return orjson.dumps({"queries": [query]})


def keys_under_budget_body() -> bytes:
    """The most unknown keys a body can hold and still pass the value count (/recommend, default limits)."""
    query: dict[str, Any] = {"user_id": "1"}
    query.update({_base36(i): 0 for i in range(405_000)})
    return orjson.dumps({"queries": [query]})


def legit_max_body() -> bytes:
    """A valid body at MAX_TOTAL_ITEMS: 1,000 queries of 100 history steps, ids and times on every step."""
    return orjson.dumps(
        {
            "queries": [
                {
                    "history": [{"item_id": str(1 + (q * 7 + n) % 1600), "timestamp": 8.8e8 + n} for n in range(100)],
                    "k": 10,
                }
                for q in range(1000)
            ]
        }
    )


def _years_filter(first: int, op: str = "any_of") -> dict[str, Any]:
    if op == "between":
        return {"any": [{"field": "release_year", "between": [y, y + 1]} for y in range(first, first + 63)]}
    return {"any": [{"field": "release_year", "any_of": [y]} for y in range(first, first + 63)]}


def number_filter_body() -> bytes:
    return orjson.dumps({"queries": [{"user_id": "1", "filter": _years_filter(1000 + 63 * q)} for q in range(64)]})


def number_filter_max_body() -> bytes:
    queries = [{"user_id": "1", "filter": _years_filter(1000 + 63 * (q % 4))} for q in range(64)]
    return orjson.dumps({"queries": queries})


def between_body() -> bytes:
    return orjson.dumps({"queries": [{"user_id": "1", "filter": _years_filter(1900, "between")}]})


def _many_posts(port: int, bodies: Any) -> dict[str, Any]:
    """Each body posted in turn on one kept-alive connection: how many answered what."""
    statuses: dict[str, int] = {}
    t0 = time.perf_counter()
    with httpx.Client(timeout=120) as c:
        for body in bodies:
            r = c.post(f"http://127.0.0.1:{port}/recommend", content=body, headers={"content-type": "application/json"})
            statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
    return {"statuses": statuses, "seconds": round(time.perf_counter() - t0, 1)}


def filter_fill(port: int, n: int) -> dict[str, Any]:
    def body(i: int) -> bytes:
        values = [f"{i:08d}-{v:03d}-".ljust(250, "x") for v in range(120)]
        return orjson.dumps({"queries": [{"user_id": "1", "filter": {"field": "item_id", "none_of": values}}]})

    return _many_posts(port, (body(i) for i in range(n))) | {"requests": n}


def long_values(port: int) -> dict[str, Any]:
    def body(i: int) -> bytes:
        values = [f"{i}-{v}-".ljust(15_000, "y") for v in range(1000)]
        return orjson.dumps({"queries": [{"user_id": "1", "filter": {"field": "item_id", "none_of": values}}]})

    return _many_posts(port, (body(i) for i in range(30)))


def steps_body() -> bytes:
    return orjson.dumps({"queries": [{"history": [{"item_id": "1"}] * 1020} for _ in range(1024)]})


def big_header(port: int, size: int = 256 << 20) -> dict[str, Any]:
    """Two connections, each sending a header that never ends; how much each got in before it was closed."""
    sent, answers = [0, 0], [0, 0]

    def one(n: int) -> None:
        with _connect(port) as s:
            try:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
                block = b"a" * (1 << 20)
                while sent[n] < size:
                    s.sendall(block)
                    sent[n] += len(block)
            except OSError:
                pass
            answers[n] = _read_status(s)[0]

    threads = [threading.Thread(target=one, args=(n,)) for n in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "mb_sent": [round(x / 2**20) for x in sent],
        "statuses": answers,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def complete_header(port: int) -> dict[str, Any]:
    with _connect(port) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 << 20) + b"\r\n\r\n")
        status, _ = _read_status(s)
    return {"status": status}


SLOW = {
    "idle": b"",
    "partial-header": b"POST /recommend HTTP/1.1\r\nHost: x\r\n",
    "partial-body": b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n{",
    "unfinished-chunked": b"POST /recommend HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",
}


def slow(port: int, wait_s: float) -> dict[str, Any]:
    socks = {}
    for name, data in SLOW.items():
        socks[name] = _connect(port)
        socks[name].sendall(data)
    time.sleep(wait_s)
    out = {}
    for name, s in socks.items():
        s.setblocking(False)
        try:
            got = s.recv(65536)
            out[name] = "closed" if got == b"" or got.startswith(b"HTTP/") else "open"
            if got.startswith(b"HTTP/"):
                out[name] = f"answered {int(got.split(b' ', 2)[1])}, closed"
        except BlockingIOError:
            out[name] = "open"
        s.close()
    return out


def _model_queries(port: int) -> float:
    """Queries the next-location model has computed, from /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("seqserve_batch_size_sum{") and 'model="mhsa' in line
    )


def abandoned(port: int) -> dict[str, Any]:
    """Two 1,024-query /next-location requests whose clients give up halfway through the first one's
    computation (the issue saw 1 s against 5 s of model time), then a small request."""
    steps = 50
    big = orjson.dumps(
        {
            "queries": [
                {
                    "history": [
                        {
                            "location_id": str(1 + (q + n) % 500),
                            "start_min": (97 * n) % 1440,
                            "weekday": n % 7,
                            "duration_min": 60,
                        }
                        for n in range(steps)
                    ],
                    "k": 5,
                }
                for q in range(1024)
            ]
        }
    )
    small = {"queries": [{"history": [{"location_id": "1", "start_min": 600, "weekday": 1, "duration_min": 30}]}]}
    request = (
        b"POST /next-location HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(big) + big
    )
    t0 = time.perf_counter()
    with _connect(port) as s:  # one big request, waited for: what the model needs for it
        s.sendall(request)
        status, _ = _read_status(s)
    one_big_s = time.perf_counter() - t0
    before = _model_queries(port)
    socks = [_connect(port) for _ in range(2)]
    for s in socks:
        s.sendall(request)
    time.sleep(one_big_s / 2)
    for s in socks:  # the clients' timeout
        s.close()
    t0 = time.perf_counter()
    r = httpx.post(f"http://127.0.0.1:{port}/next-location", json=small, timeout=60)
    small_s = time.perf_counter() - t0
    time.sleep(max(0.0, 2 * one_big_s - small_s) + 1)  # anything still running has finished
    return {
        "one_big_request_s": round(one_big_s, 2),
        "big_status": status,
        "small_status": r.status_code,
        "small_request_s": round(small_s, 3),
        "queries_computed_for_the_abandoned_two": _model_queries(port) - before - len(small["queries"]),
    }


def many(port: int, pid: int, n: int, wait_s: float) -> dict[str, Any]:
    def fds() -> int:
        return len(os.listdir(f"/proc/{pid}/fd"))

    base = fds()
    socks = []
    for _ in range(n):
        try:
            s = _connect(port)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        except OSError:
            break
    time.sleep(1)
    after_1s = fds() - base
    time.sleep(max(0.0, wait_s - 1))
    after_wait = fds() - base
    for s in socks:
        s.close()
    return {"opened": len(socks), "descriptors_held_after_1s": after_1s, f"after_{wait_s:g}s": after_wait}


def bodies_in_flight(port: int, n: int, size: int = 16 << 20) -> dict[str, Any]:
    """`n` connections from one client, each sending a `size`-byte body but its last byte, held open
    for 2 s, then closed: how many were refused at once (503) and what the rest held."""
    socks, refused = [], 0
    head = b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % size
    chunk = b" " * (size - 1)
    for _ in range(n):
        s = _connect(port)
        try:
            s.sendall(head + chunk)
        except OSError:
            s.close()
            refused += 1
            continue
        socks.append(s)
    time.sleep(2)
    for s in socks:
        s.setblocking(False)
        with contextlib.suppress(OSError):
            refused += s.recv(64).startswith(b"HTTP/1.1 503")
    for s in socks:
        s.close()
    return {"connections": n, "body_mb": round(size / 1e6, 1), "refused_503": refused}


def _status(port: int, raw: bytes, source: str = "127.0.0.1") -> int:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as s:
            s.sendall(raw)
            return _read_status(s)[0]
    except OSError:
        return 0


def half_open(port: int, n: int) -> dict[str, Any]:
    """`n` connections from 127.0.0.2 holding a half-sent header; then new connections: what /healthz,
    /readyz and /recommend answer to another address (127.0.0.1) and to the same one."""
    socks = []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        except OSError:
            break
    time.sleep(0.5)
    get = b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    body = b'{"queries":[]}'
    post = (
        b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    out: dict[str, Any] = {"opened": len(socks)}
    for who, source in (("other_client", "127.0.0.1"), ("same_client", "127.0.0.2")):
        out[who] = {
            "healthz": _status(port, get % b"/healthz", source),
            "readyz": _status(port, get % b"/readyz", source),
            "recommend": _status(port, post, source),  # 422: let in and answered; 503: refused
        }
    for s in socks:
        s.close()
    return out


def reserve(port: int, per_address: int, seconds: float = 8.0) -> dict[str, Any]:
    """Five addresses park half-sent headers past the connection cap, reconnecting, for `seconds`; new
    connections from another address and from one of the five ask for /healthz meanwhile."""
    stop_at = time.monotonic() + seconds
    opened = [0]

    def park(source: str) -> None:
        held: list[socket.socket] = []
        while time.monotonic() < stop_at:
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                held.append(s)
                opened[0] += 1
            except OSError:
                time.sleep(0.01)
            if len(held) > per_address:
                held.pop(0).close()
        for s in held:
            s.close()

    threads = [threading.Thread(target=park, args=(f"127.0.0.{n}",), daemon=True) for n in range(2, 7)]
    for t in threads:
        t.start()
    time.sleep(2)  # the attack at full size
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    out: dict[str, Any] = {}
    for who, source in (("other_client", "127.0.0.1"), ("same_client", "127.0.0.2")):
        got = []
        for _ in range(20):
            got.append(_status(port, get, source))
            time.sleep(0.1)
        out[who] = {"healthz_200": sum(g == 200 for g in got), "of": len(got), "statuses": sorted(set(got))}
    for t in threads:
        t.join()
    return out | {"connections_opened": opened[0]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    p.add_argument("--model", required=True)
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose code and .venv serve")
    p.add_argument("--attacks", nargs="+", default=["keys", "steps", "big-header", "64mb-header", "slow", "many"])
    p.add_argument("--slow-s", type=float, default=20.0)
    p.add_argument("--many", type=int, default=3000)
    p.add_argument("--bodies", type=int, default=150, help="connections of the bodies-in-flight attack")
    p.add_argument("--half-open", type=int, default=1024, help="connections of the half-open attack")
    p.add_argument("--reserve-per", type=int, default=230, help="half-open connections per address (reserve)")
    p.add_argument("--fill", type=int, default=3000, help="requests of the filter-fill attack")
    p.add_argument("--port", type=int, default=8950)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "hostile.json")
    args = p.parse_args()
    env = {
        "SEQSERVE_TORCH_THREADS": "1",
        "SEQSERVE_DEFAULT_MODEL": args.model,
        "SEQSERVE_HISTORY_PATH": f"{tempfile.mkdtemp(prefix='seqserve-hostile-')}/h.sqlite3",
    }
    results: dict[str, Any] = {"root": str(args.root.resolve()), "model": args.model}
    bodies = {
        "keys": keys_body,
        "steps": steps_body,
        "keys-under-budget": keys_under_budget_body,
        "legit-max": legit_max_body,
        "number-filter": number_filter_body,
        "number-filter-max": number_filter_max_body,
        "between-63": between_body,
    }
    for attack in args.attacks:
        proc = start_server(args.artifacts, args.port, env, root=args.root.resolve())
        try:
            body = bodies[attack]() if attack in bodies else b""
            probe, mem = Probe(f"http://127.0.0.1:{args.port}"), Memory(proc.pid)
            with probe, mem:
                time.sleep(0.3)
                if attack in bodies:
                    out = post_body(args.port, body) | {"body_mb": round(len(body) / 1e6, 1)}
                elif attack == "big-header":
                    out = big_header(args.port)
                elif attack == "64mb-header":
                    out = complete_header(args.port)
                elif attack == "filter-fill":
                    out = filter_fill(args.port, args.fill)
                elif attack == "long-values":
                    out = long_values(args.port)
                elif attack == "abandoned":
                    out = abandoned(args.port)
                elif attack == "slow":
                    out = slow(args.port, args.slow_s)
                elif attack == "bodies-in-flight":
                    out = bodies_in_flight(args.port, args.bodies)
                elif attack == "half-open":
                    out = half_open(args.port, args.half_open)
                elif attack == "reserve":
                    out = reserve(args.port, args.reserve_per)
                else:
                    out = many(args.port, proc.pid, args.many, args.slow_s)
                time.sleep(0.3)
            time.sleep(2)
            out |= {
                "healthz_worst_ms": round(probe.worst * 1000, 1),
                "healthz_failed": probe.failed,
                "rss_mb_before": round(mem.before),
                "rss_mb_peak": round(mem.peak),
                "rss_mb_2s_after": round(rss_mb(proc.pid)),
            }
        finally:
            stop(proc)
        results[attack] = out
        print(attack, json.dumps(out), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
