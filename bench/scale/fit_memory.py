"""What fitting one evaluation baseline adds to a training job's memory: a log's training part held
as the job holds it (Python lists), the job's allocator setting, then one fit; its seconds and the
process's resident memory before, at the peak and after. One process per fit, in turn.

    .venv/bin/python -m bench.scale.gen_log --rows 20000000 --users 800000 --items 200000 --out runs/log20m
    .venv/bin/python -m bench.scale.fit_memory --data runs/log20m/parquet --baselines transitions item_knn \
        --rounds 2
    .venv/bin/python -m bench.scale.fit_memory --data runs/log20m/parquet --baselines item_knn --fractions 0.25 0.5 1

`--fractions`: fit on a seeded share of the users too (what `fit_baseline` does when a fit would
outgrow its time), to see how a fit's memory follows its sample.

To compare two builds, run it from a worktree of each (docs/decisions/reuse-freed-memory.md).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.servers import ROOT


def _status_gb(field: str) -> float:
    """A memory line of /proc/self/status (VmRSS now, VmHWM its peak), in GB."""
    with open("/proc/self/status") as f:
        kib = next(line.split()[1] for line in f if line.startswith(field + ":"))
    return int(kib) * 1024 / 1e9


def _reset_peak() -> None:
    """Start VmHWM again from the current RSS, so the fit's peak is not the loading's (Linux 4.0+)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def fit_once(data: Path, baseline: str, fraction: float = 1.0) -> dict[str, float | int | str]:
    """In this process: load, split, return freed memory to the system, fit `baseline` on every user
    or on a seeded `fraction` of them."""
    import torch

    from training.data import load_interactions
    from training.jobs.recommend import index_data
    from training.jobs.recommend_eval import BASELINES
    from training.memory import reuse_freed_memory
    from training.splits import leave_one_out

    reuse_freed_memory()  # what every training job runs under
    interactions = load_interactions(data)
    items, _, sequences = index_data(interactions)
    train = leave_one_out(sequences).train
    del interactions, sequences
    if fraction < 1.0:
        keep = torch.randperm(len(train), generator=torch.Generator().manual_seed(42))[: int(fraction * len(train))]
        train = [train[u] for u in keep.sort().values.tolist()]
    # The fit starts from the held lists alone, not from the heap the loading left behind.
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    _reset_peak()
    before, t0 = _status_gb("VmRSS"), time.monotonic()
    scorer = BASELINES[baseline](train, len(items))
    seconds = time.monotonic() - t0
    peak = _status_gb("VmHWM")
    del scorer
    return {
        "baseline": baseline,
        "fraction": fraction,
        "users": len(train),
        "events": sum(map(len, train)),
        "items": items.n_entities,
        "seconds": round(seconds, 1),
        "rss_before_gb": round(before, 2),
        "peak_over_before_gb": round(max(peak - before, 0.0), 2),
        "rss_after_gb": round(_status_gb("VmRSS"), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a log the training job reads (CSV or Parquet)")
    p.add_argument("--baselines", nargs="+", default=["transitions", "item_knn"])
    p.add_argument("--fractions", type=float, nargs="+", default=[1.0], help="shares of the users to fit on")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child: fit this baseline and print its line
    args = p.parse_args()
    if args.one:
        print(json.dumps(fit_once(args.data, args.one, args.fractions[0])), flush=True)
        return
    for _ in range(args.rounds):
        for name in args.baselines:
            for fraction in args.fractions:
                cmd = [sys.executable, "-m", "bench.scale.fit_memory", "--data", str(args.data), "--one", name]
                cmd += ["--fractions", str(fraction)]
                out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
                print(out.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
