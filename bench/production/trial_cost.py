"""What the production loop and a running trial cost `/recommend` by user, alternated on one box.

    .venv/bin/python -m bench.production.trial_cost --live artifacts/sasrec-ml100k/<version> \\
        --candidate <another version folder of the same model> [--head ../head]

An artifacts folder holding both versions, and one store per variant with what the service would hold
after the admin calls (the live version pinned; the candidate on trial in the variant's mode), then
bench/serving/compare.py with the variants started at once and alternated in windows:
  off         today's defaults: online evaluation on, no key, no rule
  loop        the loop's settings (events key, the rule, new versions as canaries, probation), no trial
  canary      those, with the candidate answering a 50% canary
  interleave  those, with every by-user answer interleaving the candidate's list
  head        (--head) the defaults of another checkout: the code before a change
Every request carries the events key (the loop's by-user reads need one; the others ignore it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.store import Candidate, SQLiteStore
from bench.servers import ROOT

KEY = "trial-cost-events-key"
LOOP = f"SEQSERVE_EVENTS_API_KEY={KEY},SEQSERVE_PROMOTE_MIN_LISTS=1000,SEQSERVE_NEW_VERSIONS=canary"


def store_with(path: Path, name: str, live: str, candidate: Candidate | None) -> Path:
    """A store holding the pin (and the trial) the admin calls would have written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    store = SQLiteStore(path)
    store.set_pin(name, live)
    if candidate is not None:
        store.set_candidate(name, candidate)
    store.close()
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--live", type=Path, required=True, help="the live version's folder")
    p.add_argument("--candidate", type=Path, required=True, help="another version folder of the same model")
    p.add_argument("--head", type=Path, help="a checkout whose defaults run as the 'head' variant")
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--port", type=int, default=8950, help="the first variant's; the others' follow it; 0: any free")
    p.add_argument("--out", type=Path, default=ROOT / "runs/trial_cost.json")
    args = p.parse_args()
    name = args.live.parent.name
    work = Path(tempfile.mkdtemp(prefix="trial-cost-"))
    try:
        arts = work / "arts" / name
        arts.mkdir(parents=True)
        shutil.copytree(args.live, arts / args.live.name)
        shutil.copytree(args.candidate, arts / args.candidate.name)
        now, cand = time.time(), args.candidate.name
        trials: dict[str, Candidate | None] = {
            "loop": None,
            "canary": Candidate(cand, "canary", 0.5, now),
            "interleave": Candidate(cand, "interleave", 1.0, now),
        }
        stores = {mode: store_with(work / mode / "h.sqlite3", name, args.live.name, c) for mode, c in trials.items()}
        variants = ["off"] + [f"{mode}:SEQSERVE_HISTORY_PATH={path},{LOOP}" for mode, path in stores.items()]
        if args.head is not None:
            variants.append(f"head:root={args.head.resolve()}")
        cmd = [sys.executable, "-m", "bench.serving.compare", "--artifacts", str(work / "arts"), "--models", name]
        cmd += ["--paths", "/recommend", "--concurrency", *map(str, args.concurrency), "--rounds", str(args.rounds)]
        cmd += ["--seconds", str(args.seconds), "--api-key", KEY, "--port", str(args.port), "--out", str(args.out)]
        for v in variants:
            cmd += ["--variant", v]
        subprocess.run(cmd, cwd=ROOT, check=True)
        print(json.dumps(json.loads(args.out.read_text()), indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
