"""The production loop, proved by replay: a slice held out of training goes through the running
service as users would send it, and the service's own online figures are checked against an offline
computation on the very lists it served.

    .venv/bin/python -m bench.production.replay --out runs/replay.json

1. MovieLens-100k split by time: the first 80% of the interactions train the live version (cold), and
   a deliberately worse one is trained on a tenth of them (each user's rows sampled 1 in 10, the last
   kept). The last 20% are replayed in time order, each user's events in sequence: POST /recommend by
   user (k=10), then POST /events with what the user really did next.
2. Phase A (the first half of the slice): the live version alone.
   At its end: a warm retrain (retrainer.export_history, then `python -m training warm` from the live
   version, on the base log plus the events posted so far), published as a new version; the service
   (SEQSERVE_NEW_VERSIONS=canary) takes it as a canary for half the users on the next reload.
3. Phase B (the next quarter): the promotion rule decides on the warm candidate.
4. Phase C (the last quarter): the tenth-of-the-data version started as a canary by the admin call;
   the rule decides again.
Throughout: the service's totals per version and variant (GET /models/{name}/online) must equal the
same computation done here on the lists each response held.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pandas as pd

from bench.servers import ROOT, last_output, start_server, stop

NAME = "sasrec-ml100k"
TENTH = "20000101T000000Z"  # the tenth-of-the-data version's name: older than any, so never "new"
HOUSEKEEPING_S = 0.5  # the service's tick, which shares each worker's figures
ADMIN = "replay-admin-key"
# The promotion rule needs /events behind a key (it acts only on authenticated events); the same key
# reads stored histories and shows which version answered each user.
EVENTS = "replay-events-key"
PY = str(ROOT / ".venv/bin/python")


def load_ml100k(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path, sep="\t", usecols=[0, 1, 3], dtype=str)
    df.columns = ["user_id", "item_id", "timestamp"]
    df["timestamp"] = df["timestamp"].astype(float).astype(int)
    return df.sort_values(["timestamp", "user_id"], kind="stable").reset_index(drop=True)


def tenth(base: pd.DataFrame, seed: int = 7, *, frac: float = 0.1) -> pd.DataFrame:
    """Each user's rows sampled 1 in 10 (`frac`), the user's last row always kept (so every user stays known)."""
    last = base.groupby("user_id").tail(1).index
    keep = base.sample(frac=frac, random_state=seed).index.union(last)
    return base.loc[keep].sort_values(["timestamp", "user_id"], kind="stable")


def train(
    config: Path, data: Path, out: Path, minutes: float, name: str, *, seed: int = 42, namespace: str = "ml-100k"
) -> Path:
    t0 = time.monotonic()
    cmd = [PY, "-m", "training", "train", "--config", str(config), "--data", str(data), "--out", str(out)]
    cmd += ["--set", f"train.max_minutes={minutes}", "--set", f"name='{name}'", "--set", f"data.name='{namespace}'"]
    cmd += ["--set", f"train.seed={seed}"]
    folder = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    print(f"trained {folder} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return Path(folder)


def warm_retrain(
    env: dict[str, str], arts: Path, version: str, work: Path, minutes: float, *, seed: int = 42
) -> dict[str, Any]:
    """export_history + the warm job, timed as a retrain job would run them."""
    t0 = time.monotonic()
    log = work / "export.csv"
    subprocess.run(
        [PY, "-m", "retrainer.export_history", "--namespace", "ml-100k", "--out", str(log)],
        cwd=ROOT,
        env=env,
        check=True,
    )
    t1 = time.monotonic()
    warm = [PY, "-m", "training", "warm", "--artifact", str(arts / NAME / version), "--data", str(log)]
    out = subprocess.run(
        [*warm, "--minutes", str(minutes), "--out", str(arts), "--set", f"train.seed={seed}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    folder = Path(out.stdout.strip().splitlines()[-1])
    manifest = json.loads((folder / "manifest.json").read_text())
    return {
        "version": folder.name,
        "export_seconds": round(t1 - t0, 1),
        "train_job_seconds": round(time.monotonic() - t1, 1),
        "total_seconds": round(time.monotonic() - t0, 1),
        "test_ndcg10": manifest["metrics"]["test"]["full"]["NDCG@10"],
        "warm_start": json.loads((folder / "run_config.json").read_text()).get("warm_start"),
    }


class Replayer:
    """Sends events through the service, each user's in order, and keeps every (served list, next item).
    Events are rows of user_id, item_id, timestamp and, for a social model, action; `as_of`: each query
    asks about the moment of the user's event (a social model counts recent activity up to it)."""

    def __init__(self, url: str, *, shards: int, model: str = NAME, as_of: bool = False) -> None:
        self.url, self.shards, self.model, self.as_of = url, shards, model, as_of
        self.scored: list[tuple[str, str, list[str], str]] = []  # (version, variant, list, next item)
        self.rows: list[int] = []  # each scored list's event: its place in the replayed log
        self.sources: list[str] = []  # each scored list's source: the model, or the fallback for a new user
        self.errors = 0
        self.unknown = 0  # /recommend 404: users not in the base log, before their first event
        self.live_order: dict[str, int] = {}  # versions seen answering as the live one, in the order first seen

    async def run(self, events: pd.DataFrame) -> float:
        by_shard: dict[int, list[tuple[str, str, int, int, str | None]]] = defaultdict(list)
        actions = events["action"] if "action" in events.columns else [None] * len(events)
        for (n, u, i, t), a in zip(events[["user_id", "item_id", "timestamp"]].itertuples(), actions, strict=True):
            by_shard[hash(u) % self.shards].append((u, i, t, n, a))  # n: the row's place in the log
        t0 = time.perf_counter()
        async with httpx.AsyncClient(base_url=self.url, timeout=30, headers={"X-API-Key": EVENTS}) as client:
            await asyncio.gather(*(self._shard(client, rows) for rows in by_shard.values()))
        return time.perf_counter() - t0

    async def _shard(self, client: httpx.AsyncClient, rows: list[tuple[str, str, int, int, str | None]]) -> None:
        for user, item, ts, n, action in rows:
            query = {"user_id": user, "k": 10, **({"as_of": int(ts)} if self.as_of else {})}
            r = await client.post("/recommend", json={"model": self.model, "queries": [query]})
            if r.status_code == 404:  # a user first seen in the slice: nothing to show before its first event
                self.unknown += 1
            elif r.status_code != 200:
                self.errors += 1
            event = {"event_id": f"replay-{n}", "user_id": user, "item_id": item, "timestamp": int(ts)}
            if action is not None:
                event["action"] = action
            e = await client.post("/events", json={"model": self.model, "events": [event]})
            if e.status_code != 200 or e.json()["stored"] != 1:
                self.errors += 1
                continue
            if r.status_code == 200:
                res = r.json()["results"][0]
                live, version = r.json()["version"], res["version"]
                self.live_order.setdefault(live, len(self.live_order))
                # Another version than the live one: the version a promotion replaced, answering its holdback
                # during probation (live before this one), or a canary (a worker that has not yet followed a
                # promotion still answers the promoted version's users as its canary).
                before = self.live_order.get(version, len(self.live_order)) < self.live_order[live]
                variant = "live" if version == live else "holdback" if before else "canary"
                self.scored.append((version, variant, [x["item_id"] for x in res["items"]], item))
                self.rows.append(n)
                self.sources.append(res.get("source", "model"))


def offline(scored: list[tuple[str, str, list[str], str]]) -> dict[str, dict[str, float]]:
    """HR@10, NDCG@10, MRR per version/variant, computed here from what the responses held."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for version, variant, items, target in scored:
        a = acc[f"{version}/{variant}"]
        a[0] += 1
        if target in items:
            rank = items.index(target) + 1
            a[1] += rank <= 10
            a[2] += 1 / math.log2(rank + 1) if rank <= 10 else 0
            a[3] += 1 / rank
    return {k: {"n": a[0], "hr10": a[1] / a[0], "ndcg10": a[2] / a[0], "mrr": a[3] / a[0]} for k, a in acc.items()}


async def settled(client: httpx.AsyncClient, timeout_s: float = 30) -> dict[str, Any]:
    """Wait until the service has scored everything sent (its totals stop moving) and return them."""
    last, deadline = None, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = (await client.get(f"/models/{NAME}/online")).json()["totals"]
        if now == last:
            return dict(now)
        last = now
        await asyncio.sleep(HOUSEKEEPING_S + 0.1)  # a tick apart: each worker shared its sums in between
    return dict(last or {})


async def decision(client: httpx.AsyncClient, candidate: str, timeout_s: float = 20) -> str:
    """What became of `candidate`: promoted (it serves), retired, or still on trial."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = (await client.get(f"/models/{NAME}/versions")).json()
        if v["candidate"] is None or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    if v["candidate"] is not None:
        return "on trial"
    return "promoted" if v["pinned"] == candidate else "retired"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/ml-100k/ml-100k.inter")
    p.add_argument("--out", type=Path, default=ROOT / "runs/replay.json")
    p.add_argument("--minutes", type=float, default=2.0, help="the cold run's training budget")
    p.add_argument("--warm-minutes", type=float, default=0.5)
    p.add_argument("--min-events", type=int, default=1000, help="SEQSERVE_PROMOTE_MIN_LISTS")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shards", type=int, default=16, help="users replayed at once")
    p.add_argument("--port", type=int, default=8931)
    p.add_argument("--work", type=Path, help="a folder kept between runs (its trained models are reused)")
    p.add_argument("--decide-s", type=float, default=20.0, help="how long a phase's end waits for the rule")
    return p.parse_args()


def prepare(args: argparse.Namespace, work: Path) -> tuple[pd.DataFrame, pd.DataFrame, Path, Path]:
    """Step 1: the split by time, the live version (first 80%) and the worse one (a tenth of it), each
    trained unless --work holds them from an earlier run (whose other state is cleared)."""
    arts, state = work / "arts", work / "state"
    df = load_ml100k(args.data)
    cut = int(len(df) * 0.8)
    base, held = df.iloc[:cut], df.iloc[cut:]
    trained = sorted(p for p in (arts / NAME).glob("2*") if p.name != TENTH) if (arts / NAME).is_dir() else []
    shutil.rmtree(arts / NAME / TENTH, ignore_errors=True)
    if trained and list((work / "spare" / NAME).glob("2*")):  # --work of an earlier run: its two models again
        live, worse = trained[0], next((work / "spare" / NAME).glob("2*"))
        for extra in trained[1:]:
            shutil.rmtree(extra)
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(work / "prom", ignore_errors=True)
        return base, held, live, worse
    work.mkdir(parents=True, exist_ok=True)
    base.to_csv(work / "base.csv", index=False)
    tenth(base).to_csv(work / "tenth.csv", index=False)
    config = ROOT / "training/configs/sasrec_ml100k.toml"
    live = train(config, work / "base.csv", arts, args.minutes, NAME)
    worse = train(config, work / "tenth.csv", work / "spare", args.warm_minutes, NAME)
    return base, held, live, worse


def store_settings(work: Path) -> dict[str, str]:
    """Where the service keeps its state: what retrainer.export_history reads the live events from."""
    return {
        "SEQSERVE_ARTIFACTS_DIR": str(work / "arts"),
        "SEQSERVE_HISTORY_PATH": str(work / "state" / "h.sqlite3"),
        "SEQSERVE_STATE_DIR": str(work / "state" / "workers"),
    }


def server_settings(args: argparse.Namespace, work: Path) -> dict[str, str]:
    """The service's settings: its store, canaries for new versions, the rule, fast housekeeping."""
    (work / "prom").mkdir()
    return {
        **store_settings(work),
        "SEQSERVE_ADMIN_API_KEY": ADMIN,
        "SEQSERVE_EVENTS_API_KEY": EVENTS,
        "SEQSERVE_NEW_VERSIONS": "canary",
        "SEQSERVE_CANARY_SHARE": "0.5",
        "SEQSERVE_PROMOTE_MIN_LISTS": str(args.min_events),
        "SEQSERVE_HOUSEKEEPING_S": str(HOUSEKEEPING_S),
        "SEQSERVE_ONLINE_SCORE_S": "0.1",
        "SEQSERVE_EVENT_SKEW_S": "0",
        "PROMETHEUS_MULTIPROC_DIR": str(work / "prom"),
    }


def replay_phases(
    url: str, args: argparse.Namespace, held: pd.DataFrame, *, work: Path, live: Path, worse: Path
) -> tuple[Replayer, dict[str, Any], dict[str, Any], str]:
    """Steps 2 to 4 against the running service: the phases, the warm retrain between A and B, the worse
    version's canary between B and C, and the rule's decisions. Returns the replayer, the report's
    phase entries, the service's settled online figures and its /metrics text."""
    arts = work / "arts"
    env = {**os.environ, **store_settings(work)}
    half, three_q = len(held) // 2, (3 * len(held)) // 4
    report: dict[str, Any] = {}
    rep = Replayer(url, shards=args.shards)
    report["phase_a_seconds"] = round(asyncio.run(rep.run(held.iloc[:half])), 1)
    report["warm_retrain"] = warm_retrain(env, arts, live.name, work, args.warm_minutes)
    r = httpx.post(f"{url}/admin/reload", headers={"X-API-Key": ADMIN}, timeout=120).json()
    report["candidate_started"] = r["candidates"]
    report["phase_b_seconds"] = round(asyncio.run(rep.run(held.iloc[half:three_q])), 1)

    async def after_b() -> str:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            return await decision(c, report["warm_retrain"]["version"], args.decide_s)

    report["warm_candidate"] = asyncio.run(after_b())
    shutil.copytree(worse, arts / NAME / TENTH)  # an old-named version: never "new"
    r = httpx.post(
        f"{url}/admin/models/{NAME}/candidate",
        json={"version": TENTH, "mode": "canary", "share": 0.5},
        headers={"X-API-Key": ADMIN},
        timeout=120,
    )
    r.raise_for_status()
    report["phase_c_seconds"] = round(asyncio.run(rep.run(held.iloc[three_q:])), 1)

    async def finish() -> tuple[str, dict[str, Any], str]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            return await decision(c, TENTH, args.decide_s), await settled(c), (await c.get("/metrics")).text

    report["tenth_candidate"], service, metrics = asyncio.run(finish())
    return rep, report, service, metrics


def online_check(rep: Replayer, service: dict[str, Any]) -> dict[str, Any]:
    """The service's online figures beside the same computation on the lists it returned, and whether
    they are equal on every row (counts exactly, rates to 5 decimals). The floors (each live list's reference
    list, never shown to a client) have nothing to be computed from here: reported apart (tests/app/
    test_trials.py holds them to a hand computation)."""
    mine = offline(rep.scored)
    online: dict[str, Any] = {}
    floors = {key: value for key, value in service.items() if key.endswith("/floor")}
    for key in sorted(set(mine) | (set(service) - set(floors))):
        s, m = service.get(key, {}), mine.get(key, {})
        online[key] = {
            "service": {k: s.get(k) for k in ("n", "hr10", "ndcg10", "mrr")},
            "offline": {k: round(m[k], 5) if k != "n" else int(m[k]) for k in ("n", "hr10", "ndcg10", "mrr")}
            if m
            else None,
        }
    equal = all(
        v["offline"] is not None
        and v["service"]["n"] == v["offline"]["n"]
        and all(abs(v["service"][k] - v["offline"][k]) <= 1e-5 for k in ("hr10", "ndcg10", "mrr"))
        for v in online.values()
    )
    return {"online": online, "equal": equal, "floors": floors}


def main() -> None:
    args = parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="replay-"))
    base, held, live, worse = prepare(args, work)
    report: dict[str, Any] = {
        "data": str(args.data.name),
        "base_interactions": len(base),
        "replayed": len(held),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "workers": args.workers,
    }
    proc = start_server(work / "arts", args.port, server_settings(args, work), workers=args.workers)
    try:
        rep, phases, service, metrics = replay_phases(
            f"http://127.0.0.1:{args.port}", args, held, work=work, live=live, worse=worse
        )
        report |= phases
        report["errors"], report["unknown_user_requests"] = rep.errors, rep.unknown
        report |= online_check(rep, service)
        # Lists by source (a user the serving version did not know: the fallback's), computed here, and the
        # service's own segments, where users_fallback holds the fallback's lists.
        by_source = [(src, "all", items, t) for (_, _, items, t), src in zip(rep.scored, rep.sources, strict=True)]
        report["by_source"] = offline(by_source)
        online = httpx.get(f"http://127.0.0.1:{args.port}/models/{NAME}/online", timeout=30).json()
        report["segments"] = online["segments"]
        lines = metrics.splitlines()
        report["changes"] = [x for x in lines if x.startswith("seqserve_candidate_changes_total")]
        report["unscored"] = [x for x in lines if x.startswith("seqserve_online_unscored_total")]
        report["decisions"] = [line for line in last_output().splitlines() if "candidate" in line]
    finally:
        stop(proc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
