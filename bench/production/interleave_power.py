"""How many events each trial mode needs to tell a worse version from the live one, on the replay.

    .venv/bin/python -m bench.production.interleave_power --work runs/replay-work --out runs/interleave_power.json

The replay's split and models (bench/production/replay.py, reused from its --work folder when there):
MovieLens-100k by time, the live version trained on the first 80%, the worse one on a tenth of that.
For each mode (a 50% canary, then interleaving) a fresh service with its own store serves the live
version and tries the worse one (or --candidate, any version folder of the model) in that mode, the
promotion rule off; the last 20% of the log is replayed in time order, each user's events in sequence
(POST /recommend by user, then POST /events), in blocks. After each block, once the service has scored
everything sent, the trial's figures as the rule reads them (GET /models/{name}/online, `trial`) say
whether the candidate is told apart: the rule's anytime-valid test at its ALPHA (app/production/sequential.py):
canary, the NDCG@10 difference (users as the unit) below zero with its e-value at 1 / ALPHA;
interleaving, the sign test over users, more favouring the live version with its e-value there.
Reported per mode: the events replayed when that first held and when it held from then on, and every
block's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from app.production.sequential import ALPHA
from bench.production.replay import ADMIN, EVENTS, NAME, TENTH, Replayer, prepare, tenth, train
from bench.servers import ROOT, start_server, stop

HOUSEKEEPING_S = 0.3  # the service's tick, which shares the figures: two readings a tick apart that agree are settled


def told_apart(mode: str, figures: dict[str, Any]) -> bool:
    """Whether the trial's figures prove the candidate below the live version, as the rule's test does."""
    e = figures.get("e_value")
    if e is None or e < 1 / ALPHA:
        return False
    if mode == "interleave":
        return bool(figures["favour_live"] > figures["favour_candidate"])
    diff = figures.get("difference")
    return diff is not None and diff < 0


def settings(work: Path, mode: str) -> dict[str, str]:
    state = work / f"state-{mode}"
    shutil.rmtree(state, ignore_errors=True)
    (state / "prom").mkdir(parents=True)
    return {
        "SEQSERVE_ARTIFACTS_DIR": str(work / "arts"),
        "SEQSERVE_HISTORY_PATH": str(state / "h.sqlite3"),
        "SEQSERVE_STATE_DIR": str(state / "workers"),
        "SEQSERVE_ADMIN_API_KEY": ADMIN,
        "SEQSERVE_EVENTS_API_KEY": EVENTS,
        "SEQSERVE_PROMOTE_MIN_LISTS": "0",  # the rule off: the trial runs the whole slice
        "SEQSERVE_HOUSEKEEPING_S": str(HOUSEKEEPING_S),
        "SEQSERVE_ONLINE_SCORE_S": "0.1",
        "SEQSERVE_EVENT_SKEW_S": "0",
        "PROMETHEUS_MULTIPROC_DIR": str(state / "prom"),
    }


async def read_trial(client: httpx.AsyncClient, timeout_s: float = 30) -> dict[str, Any]:
    """The trial's figures once they stop moving (everything sent scored and shared)."""
    last, deadline = None, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = (await client.get(f"/models/{NAME}/online")).json()
        now = (body["trial"] or {}).get("figures"), body["totals"]
        if now == last and now[0] is not None:
            return dict(now[0])
        last = now
        await asyncio.sleep(HOUSEKEEPING_S + 0.1)
    return dict(last[0] or {}) if last else {}


def run_mode(mode: str, args: argparse.Namespace, work: Path, held: Any) -> dict[str, Any]:
    port = args.port
    proc = start_server(work / "arts", port, settings(work, mode), workers=1)
    url = f"http://127.0.0.1:{port}"
    try:
        body = {"version": TENTH, "mode": mode, **({"share": 0.5} if mode == "canary" else {})}
        httpx.post(f"{url}/admin/models/{NAME}/candidate", json=body, headers={"X-API-Key": ADMIN}, timeout=120)
        rep = Replayer(url, shards=args.shards)
        blocks: list[dict[str, Any]] = []
        sent, t0 = 0, time.monotonic()
        limit = min(len(held), args.max_events or len(held))
        while sent < limit:
            block = held.iloc[sent : min(limit, sent + args.block)]
            asyncio.run(rep.run(block))
            sent += len(block)

            async def figures() -> dict[str, Any]:
                async with httpx.AsyncClient(base_url=url, timeout=30) as c:
                    return await read_trial(c)

            got = asyncio.run(figures())
            blocks.append({"events": sent, "told_apart": told_apart(mode, got), **got})
            print(f"{mode}: {sent} events: {json.dumps(got)}", flush=True)
        flags = [b["told_apart"] for b in blocks]
        first = next((b["events"] for b in blocks if b["told_apart"]), None)
        # Told apart from this block on, to the end of the slice (a first crossing can be a fluke of peeking).
        held_from = next((blocks[n]["events"] for n in range(len(blocks)) if all(flags[n:])), None)
        return {
            "first_told_apart_at": first,
            "told_apart_from": held_from,
            "errors": rep.errors,
            "seconds": round(time.monotonic() - t0, 1),
            "blocks": blocks,
        }
    finally:
        stop(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/ml-100k/ml-100k.inter")
    p.add_argument("--out", type=Path, default=ROOT / "runs/interleave_power.json")
    p.add_argument("--work", type=Path, help="the replay's folder (its trained models are reused)")
    p.add_argument("--minutes", type=float, default=2.0, help="the live version's training budget")
    p.add_argument("--warm-minutes", type=float, default=0.5, help="the tenth-of-the-data version's budget")
    p.add_argument("--block", type=int, default=250, help="events replayed between two readings")
    p.add_argument("--max-events", type=int, default=0, help="stop after this many (0: the whole slice)")
    p.add_argument("--modes", nargs="+", default=["canary", "interleave"])
    p.add_argument("--shards", type=int, default=16, help="users replayed at once")
    p.add_argument("--port", type=int, default=8941)
    p.add_argument("--candidate", type=Path, help="another version folder to try (default: the tenth-of-the-data one)")
    p.add_argument(
        "--fraction",
        type=float,
        help="instead, a candidate trained here on this share of each user's base rows (the last kept), "
        "with the live version's budget: a smaller gap than the tenth's",
    )
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="interleave-"))
    base, held, _, worse = prepare(args, work)
    worse = args.candidate or worse
    if args.fraction:
        share = work / f"fraction-{args.fraction}"
        shutil.rmtree(share, ignore_errors=True)
        share.mkdir()
        tenth(base, frac=args.fraction).to_csv(share / "log.csv", index=False)
        config = ROOT / "training/configs/sasrec_ml100k.toml"
        worse = train(config, share / "log.csv", share / "arts", args.minutes, NAME)
    shutil.copytree(worse, work / "arts" / NAME / TENTH)  # an old-named version: never "new"
    report: dict[str, Any] = {
        "data": args.data.name,
        "candidate": str(worse),
        "replayed_at_most": min(len(held), args.max_events or len(held)),
        "block": args.block,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "modes": {},
    }
    try:
        for mode in args.modes:
            report["modes"][mode] = run_mode(mode, args, work, held)
    finally:
        shutil.rmtree(work / "arts" / NAME / TENTH, ignore_errors=True)
    need = {m: r["told_apart_from"] for m, r in report["modes"].items()}
    if need.get("canary") and need.get("interleave"):
        report["canary_over_interleave"] = round(need["canary"] / need["interleave"], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps({m: {k: v for k, v in r.items() if k != "blocks"} for m, r in report["modes"].items()}, indent=1))
    print(json.dumps({"canary_over_interleave": report.get("canary_over_interleave")}))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
