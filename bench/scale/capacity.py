"""A capacity plan from unit costs measured here: what a deployment of U users, E events and I items
needs (api hosts, Redis primaries and memory, training hours on R ranks, artifact size and load time).

    .venv/bin/python -m bench.scale.capacity --artifact artifacts/sasrec-ml100k/<version> \\
        --compare runs/redis_cluster.json [--users 100e6 --events 10e9 --items 10e6 --out runs/capacity.json]

Measured by this script, on this box: the history table's bytes per user and per step (the artifact's
own files), and a Redis store's bytes per live event, per arrivals entry and per online-sums row (a
real redis-server, 20,000 events of 1,000 users appended through the store, INFO memory before and
after; MEMORY USAGE of the stream and of one model's sums). Read from
earlier runs, named by flags with their defaults the figures docs/BENCHMARKS.md holds: CPU per by-user
`/recommend` (compare.py's cpu_us_per_request at c=16), training windows a second (train_speed.py:
per core here; per GPU from the H200 run, marked as such), start-up of a 5M-user artifact.
The workload (peak req/s, events a day, retrain period, epochs) is an assumption, each a flag; every
figure of the plan is derived from those and the unit costs, so the plan moves when they do.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.servers import ROOT, free_port

GB = 1e9
PER_USER = ("hashes.npy", "key_ends.npy", "ends.npy", "keys.npy")
PER_STEP = ("items.npy", "times.npy", "actions.npy")


def table_costs(artifact: Path) -> dict[str, float]:
    """Bytes per user and per step of an artifact's history table (its memory-mapped columns)."""
    from models.history_table import HistoryTable

    folder = artifact / "histories"
    table = HistoryTable(folder)
    users = len(table)
    steps = int(table.ends.data[-1]) if users else 0
    size = {p.name: p.stat().st_size for p in folder.iterdir()}
    return {
        "users": users,
        "steps": steps,
        "bytes_per_user": sum(size.get(n, 0) for n in PER_USER) / max(users, 1),
        "bytes_per_step": sum(size.get(n, 0) for n in PER_STEP) / max(steps, 1),
        "weights_bytes": (artifact / "model.pt").stat().st_size,
    }


def redis_costs(users: int = 1_000, events: int = 20_000) -> dict[str, float]:
    """Redis memory per live event (own event with its id, recent entry and arrival), and per arrival."""
    import redis

    from app.store import Event, RedisStore, Sums

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("needs redis-server")
    work = Path(tempfile.mkdtemp(prefix="capacity-"))
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work), "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        r = redis.Redis(port=port)
        deadline = time.monotonic() + 20
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        store = RedisStore(f"redis://127.0.0.1:{port}/0", keep=100_000)

        def used() -> int:
            return int(r.info("memory")["used_memory"])

        now, before = time.time(), used()
        for start in range(0, events, 500):
            batch = [
                Event(f"e{n}", f"u{n % users}", f"item{n % 5000}", now - events + n) for n in range(start, start + 500)
            ]
            store.append("plan", batch)
        every = used() - before
        stream = int(r.memory_usage(store._shared("arrivals")) or 0)
        # A model's online sums: a row per version, variant, minute bucket and segment (here 2 x 2 x 60 x 4).
        rows = {
            ("plan", f"v{v}", variant, now - 60.0 * b, segment): Sums(1, 1, 0.5, 0.5, 0.25)
            for v in range(2)
            for variant in ("live", "canary")
            for b in range(60)
            for segment in ("known", "new", "fresh", "catalog")
        }
        store.add_online(rows)
        online = int(r.memory_usage(store._of_model("plan", "online")) or 0)
        store.close()
        return {
            "bytes_per_live_event": every / events,
            "bytes_per_arrival": stream / events,
            "bytes_per_online_row": online / len(rows),
            "events": events,
        }
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def cpu_us_per_request(compare: Path | None, fallback: float) -> tuple[float, str]:
    if compare is not None and compare.exists():
        report = json.loads(compare.read_text())
        rows = report.get("recommend_by_user") or report.get("rows") or []
        if rows:
            return float(rows[0]["cpu_us_per_request"]), f"{compare} ({rows[0]['variant']}, c={rows[0]['concurrency']})"
    return fallback, "flag --cpu-us"


def plan(units: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    t, rd = units["table"], units["redis"]
    table_gb = (a.users * t["bytes_per_user"] + a.events * t["bytes_per_step"]) / GB  # it keeps every step
    weights_gb = a.items * a.d_model * 4 * 2 / GB  # item table and output table (float32), the rest is small
    live_events = a.events_per_day * a.retrain_days  # what Redis holds between two retrains
    redis_gb = (live_events * rd["bytes_per_live_event"] + a.arrivals_kept * rd["bytes_per_arrival"]) / GB
    primaries = max(math.ceil(redis_gb / a.primary_gb), math.ceil(a.events_per_s_peak / a.primary_events_per_s), 1)
    # compare.py's CPU per request is the whole machine's (its load generator and Redis too): an upper bound.
    cores = a.peak_rps * units["cpu_us_per_request"] / 1e6 / a.utilisation
    windows = a.events * a.epochs  # one training window per interaction and epoch (SASRec's sliding windows)
    # Seconds a window costs a core grow with the catalog (the item table's rows a step touches): a line
    # through the two measured points, so beyond the larger one this is an extrapolation, and says so.
    (i1, r1), (i2, r2) = (a.small_items, a.windows_per_s_core_small), (a.large_items, a.windows_per_s_core_large)
    slope = (1 / r2 - 1 / r1) / (i2 - i1)
    per_core = 1 / (1 / r1 + slope * (a.items - i1))
    return {
        "assumptions": {k: getattr(a, k) for k in ASSUMPTIONS},
        "artifact": {
            "history_table_gb": round(table_gb, 1),
            "weights_gb": round(weights_gb, 1),
            # the 5M-user start scaled by users: an upper bound (the table is memory-mapped, pages come on use)
            "start_s_at_most": round(a.start_s_5m * a.users / 5e6, 1),
        },
        "redis": {
            "live_events": live_events,
            "memory_gb": round(redis_gb, 1),
            "primaries": primaries,
            "with_replicas": 2 * primaries,
        },
        "api": {
            "cores": round(cores, 1),
            "hosts": math.ceil(cores / a.host_cores),
            "mapped_per_host_gb": round(table_gb + weights_gb, 1),  # table and weights: resident as they are read
        },
        "training": {
            "windows": windows,
            "windows_per_s_core": round(per_core, 1),
            "rate_is": "measured" if a.items <= a.large_items else f"extrapolated past {a.large_items:,.0f} items",
            "hours_on_cpu_ranks": round(windows / (per_core * a.rank_cores * a.ranks) / 3600, 1),
            "hours_at_the_large_catalog_rate": round(
                windows / (a.windows_per_s_core_large * a.rank_cores * a.ranks) / 3600, 1
            ),
            # One GPU run exists, on Beauty's 12,101 items: an upper bound of a GPU rank's rate at any larger catalog.
            "hours_on_gpu_ranks_at_most_as_fast_as": round(windows / (a.windows_per_s_gpu * a.ranks) / 3600, 1),
        },
    }


ASSUMPTIONS = (
    "users",
    "events",
    "items",
    "d_model",
    "peak_rps",
    "events_per_day",
    "events_per_s_peak",
    "retrain_days",
    "arrivals_kept",
    "epochs",
    "ranks",
    "rank_cores",
    "host_cores",
    "utilisation",
    "primary_gb",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--artifact", type=Path, required=True, help="a version folder: its history table is measured")
    p.add_argument("--compare", type=Path, help="a compare.py or redis_cluster.py report: CPU per by-user request")
    p.add_argument("--cpu-us", type=float, default=1113.0, help="CPU us per by-user request when --compare has none")
    # Training rates measured earlier (docs/BENCHMARKS.md, "How fast does training go?" and the GPU section).
    p.add_argument("--small-items", type=float, default=12_101, help="Beauty 5-core's catalog")
    p.add_argument("--windows-per-s-core-small", type=float, default=1971 / 2, help="its rate: 1,971 on 2 cores")
    p.add_argument("--large-items", type=float, default=1_058_496, help="gen_log.py's 1M-item catalog")
    p.add_argument("--windows-per-s-core-large", type=float, default=1015 / 2, help="its rate: 1,015 on 2 cores")
    p.add_argument("--windows-per-s-gpu", type=float, default=4997.0, help="the H200 run, Beauty 5-core (marked)")
    p.add_argument("--start-s-5m", type=float, default=3.0, help="start-up of the 5M-user artifact, one worker")
    p.add_argument("--primary-events-per-s", type=float, default=5384.0, help="one fsync-always server, appends")
    # The deployment and its workload: assumptions.
    p.add_argument("--users", type=float, default=100e6)
    p.add_argument("--events", type=float, default=10e9)
    p.add_argument("--items", type=float, default=10e6)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--peak-rps", type=float, default=20_000.0, help="by-user /recommend at the peak")
    p.add_argument("--events-per-day", type=float, default=200e6)
    p.add_argument("--events-per-s-peak", type=float, default=10_000.0)
    p.add_argument("--retrain-days", type=float, default=1.0, help="live events accumulate this long")
    p.add_argument("--arrivals-kept", type=float, default=200_000, help="the arrivals stream's cap")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the log per training run")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--rank-cores", type=int, default=16)
    p.add_argument("--host-cores", type=int, default=16)
    p.add_argument("--utilisation", type=float, default=0.6, help="the share of an api host's cores planned busy")
    p.add_argument("--primary-gb", type=float, default=25.0, help="memory planned per Redis primary")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "capacity.json")
    a = p.parse_args()
    cpu, where = cpu_us_per_request(a.compare, a.cpu_us)
    units = {"table": table_costs(a.artifact), "redis": redis_costs(), "cpu_us_per_request": cpu, "cpu_from": where}
    out = {"units": units, "plan": plan(units, a)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
