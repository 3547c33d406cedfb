"""The loop running itself, proved by replay: the same held-out slice through a frozen live version and
through the loop (retrainer, promotion rule and probation on), with a broken version promoted by hand
half-way, which probation must roll back by itself.

    .venv/bin/python -m bench.production.loop_replay --out runs/loop_replay.json [--work runs/loop-work]

1. A log split by time as bench/production/replay.py splits it (--data-set: MovieLens-100k and its
   SASRec model; MathOverflow and its social model, whose events carry actions and whose queries ask
   about the moment of the event; or `heavy`, a log generated here whose last fifth a few dozen users
   carry, a handful of them most of it: bench/production/heavy_log.py, --seed): the first 80% trains the
   live version (cold; reused from --work), the
   last 20% (or its first --events) is replayed in time order, each user's events in sequence (POST
   /recommend by user, then POST /events with what the user did next), paced at --rate events a second
   so that retrains and trials happen while users keep coming.
2. Frozen: a service serving the live version alone, its promotion rule off, no new versions.
3. Loop: a fresh service over the same cold version with SEQSERVE_NEW_VERSIONS=canary, the rule and
   probation on (--probation-s, with its holdback), and the retrainer (`python -m retrainer`) beside
   it: it starts warm retrains by itself when its triggers fire, and each result enters as a canary the
   rule decides. At the start of
   the third quarter the serving version's weights are shuffled into a new version, started as a
   candidate and promoted by the admin calls; probation must roll it back by itself (--promote same: a
   byte-identical copy instead, which probation must not roll back: its false rollbacks, counted over seeds).
Reported per quarter of the slice: each run's NDCG@10 of the lists users were shown against the item
they took next, and the loop's over the frozen one's (the freshness gain); each retrain from its
trigger to its candidate serving; every decision the service and the retrainer logged, with its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pandas as pd
import torch

from bench.production.heavy_log import describe, heavy_log
from bench.production.replay import ADMIN, EVENTS, PY, Replayer, load_ml100k, store_settings, train
from bench.servers import ROOT, last_output, start_server, stop

BROKEN = "20000101T000002Z"  # the shuffled version's name: older than any, so never taken as "new"
SHARED = ROOT.parent / "shared/data"


def load_social(path: Path) -> pd.DataFrame:
    """A social log (src, dst, action, timestamp) as the service's events, in time order; self-loops and
    duplicates dropped, as the training job drops them (the service refuses a self-loop)."""
    df = pd.read_csv(path, dtype={"src": str, "dst": str, "action": str})
    df = df[df["src"] != df["dst"]].drop_duplicates(["src", "dst", "action", "timestamp"])
    df = df.rename(columns={"src": "user_id", "dst": "item_id"})[["user_id", "item_id", "timestamp", "action"]]
    return df.sort_values("timestamp", kind="stable").reset_index(drop=True)


def load_csv(path: Path) -> pd.DataFrame:
    """A log of user_id, item_id, timestamp (heavy_log's), in time order."""
    df = pd.read_csv(path, dtype={"user_id": str, "item_id": str})
    return df.sort_values(["timestamp", "user_id"], kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class DataSet:
    """A log the loop is replayed on, and the model the service serves from it."""

    model: str
    config: str  # under training/configs
    namespace: str
    path: Path | None  # None: generated (`generate`) into the work folder
    load: Callable[[Path], pd.DataFrame]  # -> user_id, item_id, timestamp[, action], in time order
    as_of: bool = False  # queries ask about the moment of the user's event
    generate: Callable[[int], pd.DataFrame] | None = None  # seed -> the log


DATA_SETS = {
    "ml-100k": DataSet("sasrec-ml100k", "sasrec_ml100k.toml", "ml-100k", SHARED / "ml-100k/ml-100k.inter", load_ml100k),
    "mathoverflow": DataSet(
        "social-mathoverflow",
        "social_mathoverflow.toml",
        "mathoverflow",
        SHARED / "mathoverflow/mathoverflow_interactions.csv.gz",
        load_social,
        as_of=True,
    ),
    "heavy": DataSet(
        "sasrec-heavy", "sasrec_ml100k.toml", "heavy", None, load_csv, generate=lambda seed: heavy_log(seed=seed)
    ),
}


def shuffled(source: Path, dest: Path, seed: int = 11) -> None:
    """A copy of the version folder `source` whose weights are shuffled: each matrix's rows permuted."""
    shutil.copytree(source, dest)
    ckpt = torch.load(dest / "model.pt", weights_only=True)
    g = torch.Generator().manual_seed(seed)
    ckpt["state_dict"] = {
        k: v[torch.randperm(v.shape[0], generator=g)] if v.is_floating_point() and v.dim() >= 2 else v
        for k, v in ckpt["state_dict"].items()
    }
    torch.save(ckpt, dest / "model.pt")


def ndcg(items: list[str], target: str) -> float:
    return 1.0 / math.log2(items.index(target) + 2) if target in items[:10] else 0.0


def by_quarter(rep: Replayer, n_events: int) -> list[dict[str, float]]:
    """NDCG@10 of the lists shown, by the quarter of the slice their next event lies in."""
    sums = [[0, 0.0] for _ in range(4)]
    for (_, _, items, target), row in zip(rep.scored, rep.rows, strict=True):
        q = min(3, 4 * row // n_events)
        sums[q][0] += 1
        sums[q][1] += ndcg(items, target)
    return [{"lists": n, "ndcg10": round(s / n, 5) if n else 0.0} for n, s in sums]


async def paced(rep: Replayer, events: pd.DataFrame, *, rate: float, chunk: int = 200) -> float:
    """Replay `events` in chunks, each taking at least chunk / rate seconds; -> the seconds it took."""
    t0 = time.monotonic()
    for start in range(0, len(events), chunk):
        began = time.monotonic()
        await rep.run(events.iloc[start : start + chunk])
        await asyncio.sleep(max(0.0, chunk / rate - (time.monotonic() - began)))
    return time.monotonic() - t0


def settings(args: argparse.Namespace, work: Path, *, loop: bool) -> dict[str, str]:
    (work / "prom").mkdir(parents=True)
    common = {
        **store_settings(work),
        "SEQSERVE_ADMIN_API_KEY": ADMIN,
        "SEQSERVE_EVENTS_API_KEY": EVENTS,
        "SEQSERVE_HOUSEKEEPING_S": "0.5",
        "SEQSERVE_ONLINE_SCORE_S": "0.1",
        "SEQSERVE_EVENT_SKEW_S": "0",
        "PROMETHEUS_MULTIPROC_DIR": str(work / "prom"),
    }
    if not loop:
        return common
    return {
        **common,
        "SEQSERVE_NEW_VERSIONS": "canary",
        "SEQSERVE_CANARY_SHARE": "0.5",
        "SEQSERVE_PROMOTE_MIN_LISTS": str(args.min_events),
        "SEQSERVE_PROBATION_S": str(args.probation_s),
        "SEQSERVE_PROBATION_MAX_S": str(args.probation_max_s),
        "SEQSERVE_PROBATION_HOLDBACK": str(args.holdback),
        "SEQSERVE_PROBATION_MIN_LISTS": str(args.probation_lists),
        "SEQSERVE_PROBATION_MIN_USERS": str(args.probation_users),
    }


def retrainer_settings(args: argparse.Namespace, work: Path, url: str) -> dict[str, str]:
    """The retrainer's: the same store and artifacts, the service to reload, triggers scaled to the slice."""
    return {
        **store_settings(work),
        "SEQSERVE_ADMIN_API_KEY": ADMIN,
        "SEQSERVE_EVENTS_API_KEY": EVENTS,
        "SEQSERVE_API_URL": url,
        "SEQSERVE_RETRAIN_MODELS": args.ds.model,
        "SEQSERVE_RETRAIN_CHECK_S": "2",
        "SEQSERVE_RETRAIN_MIN_EVENTS": str(args.retrain_events),
        "SEQSERVE_RETRAIN_MINUTES": str(args.warm_minutes),
        "SEQSERVE_RETRAIN_COOLDOWN_S": "0",
        "SEQSERVE_RETRAIN_MIN_LISTS": str(args.probation_lists),
        "SEQSERVE_RETRAIN_WINDOW_S": str(args.window_s),
        "SEQSERVE_PROBATION_S": str(args.probation_s),  # no retrain while the serving version is on probation
        "SEQSERVE_RETRAINER_METRICS_PORT": "0",
    }


def run(args: argparse.Namespace, work: Path, live: Path, held: pd.DataFrame, *, loop: bool) -> dict[str, Any]:
    """One replay of the slice against a fresh service (and, for the loop, a retrainer beside it)."""
    name = args.ds.model
    shutil.rmtree(work, ignore_errors=True)
    (work / "arts" / name).mkdir(parents=True)
    shutil.copytree(live, work / "arts" / name / live.name)
    url = f"http://127.0.0.1:{args.port}"
    proc = start_server(work / "arts", args.port, settings(args, work, loop=loop), workers=args.workers)
    retrainer = None
    out: dict[str, Any] = {}
    try:
        if loop:
            log = (work / "retrainer.log").open("w")
            retrainer = subprocess.Popen(
                [PY, "-m", "retrainer"],
                cwd=ROOT,
                env={**os.environ, **retrainer_settings(args, work, url)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        rep = Replayer(url, shards=args.shards, model=name, as_of=args.ds.as_of)
        quarters = [len(held) * q // 4 for q in range(5)]
        seconds = []
        for q in range(4):
            if loop and q == 2:
                out["broken"] = break_in(url, work, name, same=args.promote == "same")
            part = held.iloc[quarters[q] : quarters[q + 1]]
            seconds.append(round(asyncio.run(paced(rep, part, rate=args.rate if loop else 1e9)), 1))
            if loop:  # what the rule and probation read at the quarter's end
                online = httpx.get(f"{url}/models/{name}/online", timeout=30).json()
                out.setdefault("decisions_read", []).append(
                    {"trial": online["trial"], "probation": online["probation"]}
                )
        out["seconds_per_quarter"] = seconds
        out["errors"], out["unknown_user_requests"] = rep.errors, rep.unknown
        out["quarters"] = by_quarter(rep, len(held))
        out["versions"] = httpx.get(f"{url}/models/{name}/versions", timeout=30).json()["versions"]
        if not loop:  # each list the frozen version served, for bench/production/probation_aa.py
            out["lists"] = [
                (row, str(held["user_id"].iloc[row]), ndcg(items, target))
                for (_, _, items, target), row in zip(rep.scored, rep.rows, strict=True)
            ]
    finally:
        if retrainer is not None:
            retrainer.terminate()
            retrainer.wait(timeout=60)
        stop(proc)
    decisions = ("candidate", "rolled back", "confirmed", "probation", "housekeeping failed", "Traceback")
    out["service_log"] = [line for line in last_output(0).splitlines() if any(d in line for d in decisions)]
    if loop:
        lines = (work / "retrainer.log").read_text().splitlines()
        out["retrainer_log"] = [line for line in lines if any(w in line for w in ("trigger", "retrain ", "no start"))]
    return out


def break_in(url: str, work: Path, name: str, *, same: bool = False) -> dict[str, Any]:
    """The serving version's weights shuffled into BROKEN (`same`: an identical copy), started as a candidate
    and promoted by hand."""
    headers = {"X-API-Key": ADMIN}
    serving = next(m for m in httpx.get(f"{url}/models", timeout=30).json()["models"] if m["name"] == name)
    if same:
        shutil.copytree(work / "arts" / name / serving["version"], work / "arts" / name / BROKEN)
    else:
        shuffled(work / "arts" / name / serving["version"], work / "arts" / name / BROKEN)
    body = {"version": BROKEN, "mode": "canary", "share": 0.5}
    httpx.post(f"{url}/admin/models/{name}/candidate", json=body, headers=headers, timeout=120).raise_for_status()
    httpx.post(f"{url}/admin/models/{name}/promote", headers=headers, timeout=120).raise_for_status()
    return {"replaced": serving["version"], "promoted_at": time.time()}


def message(line: str) -> tuple[float | None, str]:
    """(unix time, message) of a log line, the service's JSON or the retrainer's text; (None, the line) else."""
    try:
        got = json.loads(line)
        return datetime.fromisoformat(got["time"]).timestamp(), str(got["message"])
    except (ValueError, KeyError, TypeError):
        pass
    if m := re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \w+ [\w.]+: (.*)", line):
        return datetime.fromisoformat(m.group(1)).timestamp() + int(m.group(2)) / 1000, m.group(3)
    return None, line


def trigger_to_serving(loop: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Per retrain: from the first trigger's log line to its version starting as a candidate."""
    out, fired = [], None
    started = {}
    for line in loop["service_log"]:
        t, text = message(line)
        if (m := re.search(rf"candidate {name}/(\S+) started as canary \(new version\)", text)) and t is not None:
            started[m.group(1)] = t
    for line in loop["retrainer_log"]:
        t, text = message(line)
        if re.search(r" trigger \w+ fired", text) and fired is None:
            fired = t
        elif (
            m := re.search(r"retrain (\w+)(?: \(exit status -?\d+\))?(?: from \S+)? \(triggers: ([\w, ]+)\)", text)
        ) and fired is not None:
            after = sorted(v for v in started.values() if v >= fired) if m.group(1) == "published" else []
            out.append(
                {
                    "outcome": m.group(1),
                    "triggers": m.group(2),
                    "seconds_to_candidate": round(after[0] - fired, 1) if after else None,
                }
            )
            fired = None
    return out


def trials(loop: dict[str, Any], name: str, *, rate: float) -> list[dict[str, Any]]:
    """Each trial the rule decided (or left running): its candidate, mode, outcome, seconds from its start
    and about how many events that was at the replay's rate."""
    started: dict[str, float] = {}
    out = []
    for line in loop["service_log"]:
        t, text = message(line)
        if t is None:
            continue
        if m := re.search(rf"candidate {name}/(\S+) started as (\w+) \((.*)\)", text):
            for version, since in started.items():  # a new trial replaces the running one
                out.append({"version": version, "outcome": f"replaced by {m.group(1)}", "seconds": round(t - since, 1)})
            started = {m.group(1): t}
        elif (m := re.search(rf"candidate {name}/(\S+) (promoted|retired) \((.*)\)", text)) and m.group(1) in started:
            seconds = t - started.pop(m.group(1))
            out.append(
                {
                    "version": m.group(1),
                    "outcome": m.group(2),
                    "by": "rule" if m.group(3).startswith("rule") else m.group(3),
                    "seconds": round(seconds, 1),
                    "events_about": round(seconds * rate),
                    "reason": m.group(3),
                }
            )
    out += [{"version": v, "outcome": "running at the end"} for v in started]
    return out


def probation_outcome(loop: dict[str, Any], name: str) -> dict[str, Any]:
    """What probation did with the version promoted by hand: rolled back or confirmed, how long after its
    promotion, and why; or undecided when the slice ended first."""
    promoted_at = loop.get("broken", {}).get("promoted_at")
    for line in loop["service_log"]:
        t, text = message(line)
        m = re.search(rf"version {name}/{BROKEN} (rolled back to \S+|confirmed) \((.*)\)$", text)
        if m and t is not None:
            outcome = "rolled_back" if m.group(1).startswith("rolled") else "confirmed"
            after = round(t - promoted_at, 1) if promoted_at else None
            return {"outcome": outcome, "seconds_after_promotion": after, "reason": m.group(2)}
    return {"outcome": "undecided when the slice ended"}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-set", choices=sorted(DATA_SETS), default="ml-100k")
    p.add_argument("--data", type=Path, help="the data set's file (default: its file under ../shared/data)")
    p.add_argument("--seed", type=int, default=0, help="the generated log's seed (--data-set heavy)")
    p.add_argument(
        "--promote",
        choices=["shuffled", "same"],
        default="shuffled",
        help="what is promoted by hand at the third quarter: the serving version's weights shuffled, or the same",
    )
    p.add_argument("--events", type=int, default=0, help="replay only the slice's first N events (0: all of it)")
    p.add_argument("--out", type=Path, default=ROOT / "runs/loop_replay.json")
    p.add_argument("--work", type=Path, help="a folder kept between runs (its cold-trained live version is reused)")
    p.add_argument("--live", type=Path, help="a version trained on the same split (bench/production/replay.py's)")
    p.add_argument("--minutes", type=float, default=2.0, help="the cold run's training budget")
    p.add_argument("--warm-minutes", type=float, default=0.5, help="each warm retrain's (SEQSERVE_RETRAIN_MINUTES)")
    p.add_argument("--rate", type=float, default=40.0, help="events a second the loop's replay keeps to")
    p.add_argument("--retrain-events", type=int, default=3000, help="SEQSERVE_RETRAIN_MIN_EVENTS")
    p.add_argument("--min-events", type=int, default=1000, help="SEQSERVE_PROMOTE_MIN_LISTS")
    p.add_argument("--probation-lists", type=int, default=200, help="SEQSERVE_PROBATION_MIN_LISTS")
    p.add_argument("--window-s", type=float, default=120.0, help="SEQSERVE_RETRAIN_WINDOW_S (replay time is fast)")
    p.add_argument("--probation-s", type=float, default=60.0, help="SEQSERVE_PROBATION_S (replay time is fast)")
    p.add_argument("--probation-max-s", type=float, default=600.0, help="SEQSERVE_PROBATION_MAX_S")
    p.add_argument("--probation-users", type=int, default=5, help="SEQSERVE_PROBATION_MIN_USERS")
    p.add_argument(
        "--holdback",
        type=float,
        default=0.25,
        help="SEQSERVE_PROBATION_HOLDBACK: at 40 events/s a 60 s probation is 2,400 events, and the holdback's side "
        "needs SEQSERVE_PROBATION_MIN_LISTS of them",
    )
    p.add_argument(
        "--frozen-only",
        action="store_true",
        help="replay the frozen version alone: its lists for bench/production/probation_aa.py, no loop",
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shards", type=int, default=16, help="users replayed at once")
    p.add_argument("--port", type=int, default=8933)
    args = p.parse_args()
    args.ds = DATA_SETS[args.data_set]
    args.data = args.data or args.ds.path
    return args


def main() -> None:
    args = parse_args()
    ds = args.ds
    work = args.work or Path(tempfile.mkdtemp(prefix="loop-replay-"))
    if args.data is None:
        assert ds.generate is not None
        args.data = work / f"{ds.namespace}-seed{args.seed}.csv"
        if not args.data.exists():
            work.mkdir(parents=True, exist_ok=True)
            ds.generate(args.seed).to_csv(args.data, index=False)
    df = ds.load(args.data)
    cut = int(len(df) * 0.8)
    base, held = df.iloc[:cut], df.iloc[cut:].reset_index(drop=True)  # rows numbered from 0: the quarters
    held = held.iloc[: args.events or None]
    trained = sorted((work / "cold" / ds.model).glob("2*")) if (work / "cold" / ds.model).is_dir() else []
    if args.live is not None:
        live = args.live.resolve()
    elif trained:
        live = trained[0]
    else:
        work.mkdir(parents=True, exist_ok=True)
        base.to_csv(work / "base.csv", index=False)
        config = ROOT / "training/configs" / ds.config
        live = train(config, work / "base.csv", work / "cold", args.minutes, ds.model, namespace=ds.namespace)
    frozen = run(args, work / "frozen", live, held, loop=False)
    lists = frozen.pop("lists")
    pd.DataFrame(lists, columns=["row", "user_id", "ndcg10"]).to_csv(work / "frozen_lists.csv", index=False)
    if args.frozen_only:
        print(json.dumps({"log": describe(df), "frozen": frozen["quarters"]}, default=str))
        return
    loop = run(args, work / "loop", live, held, loop=True)
    report: dict[str, Any] = {
        "data": args.data.name,
        "log": describe(df) if ds.generate is not None else None,
        "base_interactions": len(base),
        "replayed": len(held),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "settings": {k: v for k, v in vars(args).items() if k not in ("data", "out", "work", "ds")},
        "quarters": [
            {
                "frozen": f,
                "loop": lp,
                "loop_over_frozen": round(lp["ndcg10"] / f["ndcg10"], 3) if f["ndcg10"] else None,
            }
            for f, lp in zip(frozen["quarters"], loop["quarters"], strict=True)
        ],
        "retrains": trigger_to_serving(loop, ds.model),
        "trials": trials(loop, ds.model, rate=args.rate),
        "promoted_by_hand": args.promote,
        "probation": probation_outcome(loop, ds.model),
        "rolled_back": any("rolled back" in line and BROKEN in line for line in loop["service_log"]),
        "frozen": frozen,
        "loop": loop,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str))
    keys = ("log", "quarters", "retrains", "trials", "probation")
    print(json.dumps({k: report[k] for k in keys}, indent=2, default=str))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
