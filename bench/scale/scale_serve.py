"""Serving millions of users: start-up time, resident memory and by-user throughput against the number of
users an artifact holds.

    .venv/bin/python -m bench.scale.scale_serve --artifact artifacts/sasrec-ml100k --users 0 1000000 5000000 \
        --workers 1 2

For each user count it copies the artifact's newest version with its histories replaced by that many
synthetic users x --events items (drawn from the model's catalog by popularity; 0 = the artifact as it
is), starts the service (`python -m app.server`, fresh history store) with each worker count, and
reports: seconds until /readyz answers 200, resident memory (RSS) and proportional memory (PSS: a page
shared by two workers counts half in each) of all the service's processes, right after start and after
--requests by-user requests of random users, and /recommend by user at 16 clients for --seconds.

--cold (the default) drops the page cache after building each artifact. --layout json writes
histories.json and users.json, the layout before the memory-mapped table, and --code runs the
service from another checkout (a `git worktree` of an older commit), so the earlier code is
measured in the same run on the same data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2 as httpx
import numpy as np

from bench.servers import free_port
from models.artifact import latest_versions
from models.history_table import HistoryTable, write_table
from models.ids import N_SPECIAL, IdMap

ROOT = Path(__file__).resolve().parents[2]


def user_ids(n: int) -> list[str]:
    return [f"user{u:08d}" for u in range(n)]


def build(src: Path, dst: Path, *, users: int, events: int, layout: str, seed: int = 0) -> None:
    """A copy of version `src` holding `users` synthetic users' histories (`users` 0: as it is)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("histories", "histories.json", "users.json"))
    items = IdMap.load(src / "items.json")
    rng = np.random.default_rng(seed)
    n_items = items.n_entities
    if users == 0:  # the artifact's own users, in the asked layout
        shutil.copytree(src / "histories", dst / "histories")
        if layout == "json":
            table = HistoryTable(dst / "histories")
            old = {u: [[i, t] for i, t, _ in table.timeline(u, items)] for u in table.users()}
            (dst / "histories.json").write_text(json.dumps(old))
            (dst / "users.json").write_text(json.dumps({"pad": 0, "unk": 1, "ids": list(old)}))
            shutil.rmtree(dst / "histories")
        return
    pop = 1.0 / np.arange(1, n_items + 1) ** 0.9  # Zipf-like popularity over the catalog
    picks = rng.choice(n_items, size=users * events, p=pop / pop.sum()).astype(np.int32) + N_SPECIAL
    start = rng.uniform(8.8e8, 8.9e8, size=users)
    times = (start[:, None] + np.arange(events)[None, :] * 3600.0).ravel()
    ids = user_ids(users)
    if layout == "table":
        write_table(dst / "histories", ids, np.full(users, events), items=picks, times=times)
        return
    raws = items.raws()
    with (dst / "histories.json").open("w") as f:
        f.write("{")
        for u in range(users):
            row = picks[u * events : (u + 1) * events].tolist()
            ts = times[u * events : (u + 1) * events].tolist()
            f.write(
                ("," if u else "")
                + json.dumps(ids[u])
                + ":"
                + json.dumps([[raws[i - N_SPECIAL], t] for i, t in zip(row, ts, strict=True)])
            )
        f.write("}")
    (dst / "users.json").write_text(json.dumps({"pad": 0, "unk": 1, "ids": ids}))


def _drop_page_cache() -> None:
    """Start from a cold page cache, as after a deploy or a reboot. Pages the build just wrote sit in
    the cache as large folios, and a fault on a mapped file maps a whole folio: a few thousand random
    lookups would then show the entire table as resident (file pages, shared and reclaimable, but
    counted in RSS)."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _tree(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-g", str(os.getpgid(pid))], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def _memory(pids: list[int]) -> tuple[float, float, float]:
    """RSS, PSS and anonymous RSS (what is not file pages: the heap, tensors) of these processes, summed, in GB."""
    rss = pss = anon = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
                elif line.startswith("Anonymous:"):
                    anon += int(line.split()[1])
        except OSError:
            continue
    return rss / 1e6, pss / 1e6, anon / 1e6


async def _by_user(
    url: str, model: str, users: list[str], *, clients: int, seconds: float | None, total: int | None
) -> tuple[int, int]:
    """Requests for random users from `clients` connections; (answered 200, other)."""
    ok = bad = sent = 0
    stop = time.perf_counter() + (seconds or 1e9)
    rng = np.random.default_rng(1)

    async def client() -> None:
        nonlocal ok, bad, sent
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            while time.perf_counter() < stop and (total is None or sent < total):
                sent += 1
                user = users[int(rng.integers(len(users)))]
                r = await c.post("/recommend", json={"model": model, "queries": [{"user_id": user, "k": 10}]})
                ok, bad = (ok + 1, bad) if r.status_code == 200 else (ok, bad + 1)

    await asyncio.gather(*[client() for _ in range(clients)])
    return ok, bad


def measure(
    root: Path, *, model: str, users: list[str], workers: int, code: Path, requests: int, seconds: float
) -> dict[str, float]:
    port = free_port()
    state = Path(tempfile.mkdtemp(prefix="scale-state-"))
    env = {
        **os.environ,
        "SEQSERVE_ARTIFACTS_DIR": str(root),
        "SEQSERVE_HOST": "127.0.0.1",
        "SEQSERVE_PORT": str(port),
        "SEQSERVE_WORKERS": str(workers),
        "SEQSERVE_LOG_LEVEL": "WARNING",
        "SEQSERVE_STATE_DIR": str(state),
        "SEQSERVE_HISTORY_PATH": str(state / "histories.sqlite3"),
        "SEQSERVE_TORCH_THREADS": "1",
        "PYTHONPATH": str(code),
    }
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.server"],
        cwd=code,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    peak = 0.0
    try:
        while True:
            peak = max(peak, _memory(_tree(proc.pid))[0])
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError("the service exited before it was ready")
            time.sleep(0.2)
        ready_s = time.perf_counter() - t0
        time.sleep(1.0)
        rss0, pss0, _ = _memory(_tree(proc.pid))
        _, bad = asyncio.run(_by_user(url, model, users, clients=16, seconds=None, total=requests))
        rss1, pss1, anon1 = _memory(_tree(proc.pid))
        ok2, bad2 = asyncio.run(_by_user(url, model, users, clients=16, seconds=seconds, total=None))
        assert bad == bad2 == 0, f"{bad + bad2} requests failed"
        return {
            "ready_s": ready_s,
            "peak_start_rss_gb": peak,
            "rss_gb": rss0,
            "pss_gb": pss0,
            "rss_after_gb": rss1,
            "pss_after_gb": pss1,
            "anon_after_gb": anon1,
            "req_s_16": ok2 / seconds,
        }
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--artifact",
        type=Path,
        default=ROOT / "artifacts" / "sasrec-ml100k",
        help="an artifact name folder (its newest version is copied)",
    )
    p.add_argument("--users", type=int, nargs="+", default=[0, 1_000_000, 5_000_000])
    p.add_argument("--events", type=int, default=20)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--layout", choices=["table", "json"], default="table")
    p.add_argument("--code", type=Path, default=ROOT, help="the checkout whose service is measured")
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument(
        "--cold",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="drop the page cache before each user count (needs root; --no-cold keeps it)",
    )
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "scale_serve")
    args = p.parse_args()
    src = latest_versions(args.artifact.parent)[args.artifact.name]
    print(
        f"| users | layout | workers | artifact GB | ready s | peak RSS at start GB | RSS GB | PSS GB |"
        f" RSS after {args.requests} users GB | PSS after GB | of which anonymous GB | by-user req/s, 16 clients |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.users:
        root = args.work / f"{args.layout}-{n}"
        shutil.rmtree(root, ignore_errors=True)
        dst = root / args.artifact.name / src.name
        t0 = time.perf_counter()
        build(src, dst, users=n, events=args.events, layout=args.layout)
        size = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file()) / 1e9
        print(f"built {n} users in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        if args.cold:
            _drop_page_cache()
        ids = user_ids(n) if n else (list(HistoryTable(src / "histories").users()))
        for w in args.workers:
            m = measure(
                root,
                model=args.artifact.name,
                users=ids,
                workers=w,
                code=args.code,
                requests=args.requests,
                seconds=args.seconds,
            )
            print(
                f"| {n or len(ids)} | {args.layout} | {w} | {size:.2f} | {m['ready_s']:.1f} |"
                f" {m['peak_start_rss_gb']:.2f} | {m['rss_gb']:.2f} | {m['pss_gb']:.2f} | {m['rss_after_gb']:.2f} |"
                f" {m['pss_after_gb']:.2f} | {m['anon_after_gb']:.2f} | {m['req_s_16']:.0f} |",
                flush=True,
            )
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
