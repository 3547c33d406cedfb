"""A warm retrain against a cold one on the same data: time to a published version, and test figures.

    .venv/bin/python -m bench.production.warm_retrain --events 5000 --out runs/warm_retrain.json

MovieLens-100k's first 80% by time train the served version (cold, the default config's 2-minute
budget); the next `--events` interactions are posted to the running service through POST /events.
Then, timed from the first command to the published folder: `retrainer.export_history` (the served
version's histories plus the stored events, from the store) and `python -m training warm` from the
served version with a `--minutes` budget. The cold run trains the default config from scratch on the
very log the export wrote; both are tested the same way (leave-one-out on that log, full ranking).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

import httpx2 as httpx

from bench.production.replay import NAME, load_ml100k, train, warm_retrain
from bench.servers import ROOT, start_server, stop


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/ml-100k/ml-100k.inter")
    p.add_argument("--events", type=int, default=5000)
    p.add_argument("--minutes", type=float, default=0.5, help="the warm run's training budget")
    p.add_argument("--cold-minutes", type=float, default=2.0)
    p.add_argument("--base", type=Path, help="a version trained on the first 80% (default: trained here)")
    p.add_argument("--out", type=Path, default=ROOT / "runs/warm_retrain.json")
    p.add_argument("--port", type=int, default=8932)
    p.add_argument("--seed", type=int, default=42, help="train.seed of the warm and the cold run")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="warm-"))
    arts, config = work / "arts", ROOT / "training/configs/sasrec_ml100k.toml"
    df = load_ml100k(args.data)
    cut = int(len(df) * 0.8)
    if args.base is not None:
        shutil.copytree(args.base, arts / NAME / args.base.name)
        base = arts / NAME / args.base.name
    else:
        df.iloc[:cut].to_csv(work / "base.csv", index=False)
        base = train(config, work / "base.csv", arts, args.cold_minutes, NAME)
    env = {
        **os.environ,
        "SEQSERVE_ARTIFACTS_DIR": str(arts),
        "SEQSERVE_HISTORY_PATH": str(work / "state/h.sqlite3"),
        "SEQSERVE_STATE_DIR": str(work / "state/workers"),
    }
    server_env = {k: env[k] for k in ("SEQSERVE_HISTORY_PATH", "SEQSERVE_STATE_DIR")}
    proc = start_server(arts, args.port, server_env)
    try:
        posted = df.iloc[cut : cut + args.events]
        for start in range(0, len(posted), 500):
            chunk = posted.iloc[start : start + 500]
            events = [
                {"event_id": f"w{n}", "user_id": u, "item_id": i, "timestamp": int(t)}
                for n, u, i, t in chunk[["user_id", "item_id", "timestamp"]].itertuples()
            ]
            r = httpx.post(f"http://127.0.0.1:{args.port}/events", json={"model": NAME, "events": events}, timeout=60)
            r.raise_for_status()
    finally:
        stop(proc)
    warm = warm_retrain(env, arts, base.name, work, args.minutes, seed=args.seed)
    cold = train(config, work / "export.csv", work / "cold", args.cold_minutes, NAME, seed=args.seed)
    cold_manifest = json.loads((cold / "manifest.json").read_text())
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "events_posted": len(posted),
        "seed": args.seed,
        "warm": warm,
        "cold": {
            "test_ndcg10": cold_manifest["metrics"]["test"]["full"]["NDCG@10"],
            "train_seconds": cold_manifest["metrics"]["train_seconds"],
        },
        "base_test_ndcg10": json.loads((base / "manifest.json").read_text())["metrics"]["test"]["full"]["NDCG@10"],
    }
    report["warm_over_cold"] = round(warm["test_ndcg10"] / report["cold"]["test_ndcg10"], 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
