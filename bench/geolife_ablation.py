"""GeoLife next-location ablation: variants x seeds, mean and spread, baselines beside them.

    .venv/bin/python bench/geolife_ablation.py --data ../shared/data/geolife-staypoints/dataSet_geolife.csv \
        --seeds 0 1 2 --parallel 2 --out runs/ablation

Each run is a normal training job (`python -m training train`) with one torch thread, so two run
side by side on a 2-core machine; the table is printed as Markdown and saved as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {
    "seed MHSA (reference config)": ("training/configs/mhsa_seed_geolife.toml", []),
    "+ copy head": ("training/configs/mhsa_seed_geolife.toml", ["model.pointer=true", "name='abl-pointer'"]),
    "+ new-place labels": ("training/configs/mhsa_seed_geolife.toml",
                           ["train.novel_as_unknown=true", "name='abl-novel'"]),
    "shipped: copy head + new-place labels": ("training/configs/mhsa_geolife.toml", []),
}
KEYS = ("Acc@1", "Acc@5", "Acc@10", "MRR", "NDCG@10", "F1_weighted")


def run(config: str, overrides: list[str], seed: int, data: Path, out: Path, variant: str, extra: list[str]) -> dict:
    tag = f"{re.sub(r'[^a-z0-9]+', '-', variant.lower()).strip('-')}-s{seed}"
    sets = [f"train.seed={seed}", "train.threads=1", *overrides, *extra]
    cmd = [sys.executable, "-m", "training", "train", "--config", config, "--data", str(data),
           "--out", str(out / tag), *[a for o in sets for a in ("--set", o)]]
    log = out / f"{tag}.log"
    with log.open("w") as f:
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=f, stderr=subprocess.STDOUT)
    manifest = next((out / tag).glob("*/*/manifest.json"))
    return json.loads(manifest.read_text())["metrics"]


def summary(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "ablation")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    p.add_argument("--set", dest="extra", action="append", default=[], help="extra override for every run")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(v, s) for v in args.variants for s in args.seeds]
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(
            lambda vs: run(*VARIANTS[vs[0]], vs[1], args.data.resolve(), args.out, vs[0], args.extra), jobs
        ))
    by_variant: dict[str, list[dict]] = {}
    for (v, _), m in zip(jobs, results, strict=True):
        by_variant.setdefault(v, []).append(m)
    rows = []
    first = results[0]["baselines_test"]
    for name, key in (("most recent", "most_recent"), ("most frequent", "most_frequent"), ("Markov", "markov")):
        rows.append((f"baseline: {name}", "-", {k: f"{first[key]['all'][k]:.4f}" for k in KEYS},
                     f"{first[key]['known']['Acc@1']:.4f}"))
    for v, ms in by_variant.items():
        cells = {k: summary([m["test"]["all"][k] for m in ms]) for k in KEYS}
        known = summary([m["test"]["known"]["Acc@1"] for m in ms])
        secs = f"{statistics.mean(m['train_seconds'] for m in ms):.0f}"
        rows.append((v, secs, cells, known))
    print(f"| model | train s (mean) | {' | '.join(KEYS)} | Acc@1 known targets |")
    print("|---|---|" + "---|" * len(KEYS) + "---|")
    for name, secs, cells, known in rows:
        print(f"| {name} | {secs} | {' | '.join(cells[k] for k in KEYS)} | {known} |")
    (args.out / "ablation.json").write_text(json.dumps({v: ms for v, ms in by_variant.items()}, indent=1))


if __name__ == "__main__":
    main()
