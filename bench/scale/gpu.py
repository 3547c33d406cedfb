"""The GPU path in one run: the CUDA tests, the model's latency, the service's throughput and a training
budget, each on CUDA beside the same host's CPU; every figure in one JSON file.

    bench/scale/gpu.sh --wheels .gpu/wheels -- --artifact .gpu/sasrec-ml100k \\
        --data .gpu/data/beauty_5core.txt --out "$OUT/gpu.json"          # on a GPU machine (bench/scale/gpu.sh)
    .venv/bin/python -m bench.scale.gpu --tiny --devices cpu --artifact <version folder> \\
        --data <log> --train-set ... --out /tmp/gpu.json                  # every step on the CPU, tiny sizes

Steps (--steps picks some; each one's figures are written as soon as it ends, and one that fails is
recorded with its error while the others still run):
  tests  the CUDA tests (tests/*/test_cuda.py; they skip where there is no CUDA)
  model  one query and a batch of --batch queries through the serving engine (models/tasks: traced
         scores, exclusions, top-10, the copy back), at the artifact's catalog and at --items synthetic
         items, on each of --devices: the median of --repeats calls
  profile  torch.profiler over one-query model calls on the first device: where the time goes
  serve  the service (app.server) on each device with both catalogs loaded, /recommend by user_id at
         each --concurrency, the devices' servers alternated in windows (bench/serving/loadgen.py's `alternate`)
  train  `python -m training train` of --train-config on --data for a --train-minutes budget on the
         first device: epochs, training windows a second (the loop's own per-epoch figure), validation
         and test NDCG@10, beside the CPU figures this repository's docs give (--cpu-windows-per-s,
         --cpu-valid-ndcg)
The catalog of --items is the artifact's SASRec configuration with random weights, --users synthetic
users of --events Zipf-drawn items each: its timings hold for any weights of that shape, its rankings
mean nothing. Targets (the GPU issue's) are checked at the end under "targets".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.servers import ROOT, pause, start_server, stop
from bench.serving.loadgen import alternate, bodies_for
from models.artifact import latest_versions
from models.checkpoint import save_checkpoint
from models.engine import EngineOptions
from models.history_table import write_table
from models.ids import N_SPECIAL, IdMap
from models.sasrec import SASRec, SASRecConfig
from models.tasks import TASKS
from models.tasks.recommend import RecEngine, RecQuery

CUDA_TESTS = ["tests/models/test_cuda.py", "tests/app/test_cuda.py", "tests/training/test_cuda.py"]
# The 2-core CPU's figures in docs/BENCHMARKS.md that the GPU's training is read against.
CPU_WINDOWS_PER_S = 1971.0  # Beauty 5-core, bench/training/train_speed.py, median of three ("training throughput")
TARGETS = {  # what the GPU path must reach (docs/BENCHMARKS.md, "What changes on a GPU machine?")
    "one_query_ms": 0.5,
    "batch_256_at_1m_ms": 3.0,
    "serve_gpu_over_cpu": 3.0,
    "train_windows_over_cpu": 10.0,
}


class Report:
    """The JSON file, rewritten after every step so a run stopped half-way keeps what it measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def step(self, name: str, fn: Callable[[], Any]) -> None:
        t0 = time.monotonic()
        print(f"[gpu] {name} ...", flush=True)
        try:
            self.data[name] = fn()
        except Exception as exc:  # one step's failure is a finding; the next step still runs
            self.data[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        self.data.setdefault("seconds", {})[name] = round(time.monotonic() - t0, 1)
        print(f"[gpu] {name}: {json.dumps(self.data[name])[:2000]}", flush=True)
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


def environment(devices: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "devices": devices,
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1), cuda_version=torch.version.cuda)
        smi = shutil.which("nvidia-smi")
        if smi:
            q = "--query-gpu=driver_version,clocks.max.sm"
            out["nvidia_smi"] = subprocess.run([smi, q, "--format=csv,noheader"], capture_output=True, text=True).stdout
    return out


def run_tests(timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CUDA_TESTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = proc.stdout.strip().splitlines()
    return {
        "returncode": proc.returncode,
        "summary": lines[-1] if lines else "",
        "failures": [line for line in lines if line.startswith(("FAILED", "ERROR"))],
        "tail": (proc.stdout[-3000:] + proc.stderr[-1500:]) if proc.returncode else "",
        "seconds": round(time.monotonic() - t0, 1),
    }


def synthetic_catalog(src: Path, root: Path, *, items: int, users: int, events: int, seed: int = 0) -> str:
    """A SASRec version under `root` with `items` items, shaped as `src`'s model, random weights and
    `users` synthetic users of `events` Zipf-drawn items each. Returns its name."""
    manifest = json.loads((src / "manifest.json").read_text())
    assert manifest["kind"] == "sasrec", f"{src} is a {manifest['kind']} model; the bench serves SASRec"
    name = f"sasrec-{items}-items"
    dst = root / name / manifest["version"]
    dst.mkdir(parents=True)
    torch.manual_seed(seed)
    config = SASRecConfig(**{**manifest["config"]["model"], "vocab_size": items + N_SPECIAL})
    save_checkpoint(dst / "model.pt", "sasrec", SASRec(config))
    ids = IdMap(f"i{n}" for n in range(items))
    ids.save(dst / "items.json")
    (dst / "item_meta.json").write_text(json.dumps({"unit": None, "release": {}}))
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, items + 1) ** 0.9
    picks = rng.choice(items, size=users * events, p=pop / pop.sum()).astype(np.int32) + N_SPECIAL
    start = rng.uniform(8.8e8, 8.9e8, size=users)
    times = (start[:, None] + np.arange(events)[None, :] * 3600.0).ravel()
    write_table(
        dst / "histories", [f"user{u:08d}" for u in range(users)], np.full(users, events), items=picks, times=times
    )
    manifest.update(name=name, namespace=f"synthetic-{items}", metrics={})
    manifest["config"]["model"]["vocab_size"] = items + N_SPECIAL
    manifest["config"]["name"] = name
    manifest["data"] = {"source": "synthetic", "users": users, "items": items, "interactions": users * events}
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return name


def catalogs(artifact: Path, root: Path, args: argparse.Namespace) -> dict[str, str]:
    """An artifacts root holding the given version and the synthetic catalog: catalog size -> model name."""
    name = json.loads((artifact / "manifest.json").read_text())["name"]
    shutil.copytree(artifact, root / name / artifact.name)
    items = len(IdMap.load(artifact / "items.json")) - N_SPECIAL
    big = synthetic_catalog(artifact, root, items=args.items, users=args.users, events=args.events)
    return {str(items): name, str(args.items): big}


def model_latency(root: Path, models: dict[str, str], devices: list[str], *, batch: int, repeats: int) -> dict:
    """ms per call of the engine's infer (the service's model call) for 1 and `batch` stored users."""
    out: dict[str, Any] = {"batch": batch, "repeats": repeats, "cpu_threads": torch.get_num_threads()}
    task = TASKS["recommend"]
    for size, model in models.items():
        folder = latest_versions(root)[model]
        for device in devices:
            engine = task.open(folder, EngineOptions(device=torch.device(device)))
            assert isinstance(engine, RecEngine)
            users = [engine.art.histories.user(r) for r in range(min(batch, len(engine.art.histories)))]
            prepared = engine.prepare([RecQuery(u, k=10) for u in users], {})
            row: dict[str, Any] = {"scoring": engine.scoring}
            for n in (1, len(prepared)):
                part = prepared[:n]
                for _ in range(3):
                    engine.infer(part)  # warm: kernels chosen, caches filled
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    engine.infer(part)  # ends with the top-k on the host: the device has synchronised
                    times.append(time.perf_counter() - t0)
                row[f"batch_{n}_ms"] = round(statistics.median(times) * 1000, 4)
                row[f"batch_{n}_ms_p90"] = round(sorted(times)[int(0.9 * len(times))] * 1000, 4)
            out[f"{size}/{device}"] = row
            del engine
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return out


def serve(root: Path, models: dict[str, str], devices: list[str], args: argparse.Namespace) -> dict:
    """/recommend by user on each device's server, the servers alternated in windows for each load."""
    out: dict[str, Any] = {
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "workers": args.workers,
        "client_procs": args.client_procs,
    }
    procs = {}
    with tempfile.TemporaryDirectory() as state:
        try:
            for n, device in enumerate(devices):
                env = {
                    "SEQSERVE_DEVICE": device,
                    "SEQSERVE_HISTORY_PATH": f"{state}/{device}.sqlite3",
                    "SEQSERVE_WORKERS": str(args.workers),
                }
                port = args.port + n
                t0 = time.monotonic()
                procs[device] = (start_server(root, port, env, workers=args.workers), port)
                out[f"ready_s/{device}"] = round(time.monotonic() - t0, 1)
            for proc, _ in procs.values():
                pause(proc, True)  # until its windows: alternate() resumes it
            for size, model in models.items():
                bodies = bodies_for(root, model)
                targets = {d: (proc, f"http://127.0.0.1:{port}/recommend") for d, (proc, port) in procs.items()}
                for c in args.concurrency:
                    got = alternate(
                        targets,
                        bodies,
                        c,
                        rounds=args.rounds,
                        seconds=args.seconds,
                        warmup=args.warmup,
                        procs=args.client_procs,
                    )
                    for device, r in got.items():
                        out[f"{size}/{device}/c{c}"] = {
                            k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()
                        }
        finally:
            for proc, _ in procs.values():
                stop(proc)
    return out


def profile(root: Path, models: dict[str, str], device: str, *, calls: int) -> dict[str, Any]:
    """Where one query's model call spends its time on `device`: torch.profiler over `calls` calls at
    batch 1, per call: the top operators by host time and by device time, and the runtime calls
    (kernel launches, copies, synchronisations) the host makes."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    out: dict[str, Any] = {"calls": calls}
    for size, model in models.items():
        engine = TASKS["recommend"].open(latest_versions(root)[model], EngineOptions(device=torch.device(device)))
        assert isinstance(engine, RecEngine)
        prepared = engine.prepare([RecQuery(engine.art.histories.user(0), k=10)], {})
        for _ in range(5):
            engine.infer(prepared)
        with torch_profile(activities=activities) as prof:
            for _ in range(calls):
                engine.infer(prepared)
        events = prof.key_averages()

        def device_us(e: Any) -> float:
            return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)))

        def top(key: Callable[[Any], float], events: Any = events) -> list[tuple[str, float, float]]:
            best = sorted(events, key=key, reverse=True)[:12]
            return [(e.key, round(e.count / calls, 1), round(key(e) / calls, 1)) for e in best if key(e) > 0]

        runtime = {e.key: round(e.count / calls, 1) for e in events if e.key.startswith(("cuda", "cu"))}
        out[size] = {
            "host_us_per_call": round(sum(e.self_cpu_time_total for e in events) / calls, 1),
            "device_us_per_call": round(sum(device_us(e) for e in events) / calls, 1),
            "top_host_us": top(lambda e: float(e.self_cpu_time_total)),
            "top_device_us": top(device_us),
            "runtime_calls": runtime,
        }
        del engine
    return out


# The loop's line per epoch: training windows a second over its steps alone, then its validation's seconds.
EPOCH_LINE = re.compile(r"epoch (\d+) loss .*\((\d+)s, (\d+) rows/s training, validation ([\d.]+)s\)")


def train(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """One training job for a fixed budget; its figures from its log and its manifest."""
    with tempfile.TemporaryDirectory() as out_root:
        sets = [f"train.max_minutes={args.train_minutes}", f"train.device='{device}'", *args.train_set]
        cmd = [sys.executable, "-m", "training", "train", "--config", str(args.train_config), "--data", str(args.data)]
        cmd += ["--out", out_root, *[x for s in sets for x in ("--set", s)]]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.train_minutes * 60 + 300)
        wall = time.monotonic() - t0
        log = proc.stdout + proc.stderr
        if proc.returncode:
            raise RuntimeError(f"training exited {proc.returncode}: {log[-3000:]}")
        folder = next(iter(latest_versions(Path(out_root)).values()))
        metrics = json.loads((folder / "manifest.json").read_text())["metrics"]
    epochs = list(EPOCH_LINE.finditer(log))
    rates = [int(m.group(3)) for m in epochs]
    validation_s = [float(m.group(4)) for m in epochs]
    full = "full"
    windows = statistics.median(rates) if rates else None
    return {
        "device": device,
        "minutes": args.train_minutes,
        "wall_s": round(wall, 1),
        "epochs_run": metrics.get("epochs_run"),
        "best_epoch": metrics.get("best_epoch"),
        "stopped": metrics.get("stopped"),
        "windows_per_s_median": windows,
        "windows_per_s_each_epoch": rates,
        "validation_s_median": statistics.median(validation_s) if validation_s else None,
        "valid_ndcg10": metrics.get("valid", {}).get(full, {}).get("NDCG@10"),
        "test_ndcg10": metrics.get("test", {}).get(full, {}).get("NDCG@10"),
        "seconds": metrics.get("seconds"),
        "cpu_windows_per_s": args.cpu_windows_per_s,
        "cpu_valid_ndcg10": args.cpu_valid_ndcg,
        "windows_over_cpu": round(windows / args.cpu_windows_per_s, 2) if windows else None,
    }


def targets(data: dict[str, Any], models: dict[str, str], devices: list[str], args: argparse.Namespace) -> dict:
    """Each target with what was measured; a step that did not run or failed leaves its targets unmeasured."""
    gpu, cpu = devices[0], devices[-1]
    big = str(args.items)
    out: dict[str, Any] = {}
    lat = data.get("model", {})
    if f"{big}/{gpu}" in lat:
        one = max(lat[f"{s}/{gpu}"]["batch_1_ms"] for s in models)
        out["one_query_ms"] = {
            "measured": one,
            "target": TARGETS["one_query_ms"],
            "met": one <= TARGETS["one_query_ms"],
        }
        b = lat[f"{big}/{gpu}"][f"batch_{args.batch}_ms"]
        t = TARGETS["batch_256_at_1m_ms"]
        out["batch_256_at_1m_ms"] = {
            "measured": b,
            "target": t,
            "met": b <= t,
            "batch": args.batch,
            "items": args.items,
        }
    srv = data.get("serve", {})
    ratios = {}
    for size in models:
        for c in args.concurrency:
            g, k = srv.get(f"{size}/{gpu}/c{c}"), srv.get(f"{size}/{cpu}/c{c}")
            if g and k and k["rps"]:
                ratios[f"{size}/c{c}"] = round(g["rps"] / k["rps"], 2)
    if ratios:
        t = TARGETS["serve_gpu_over_cpu"]
        out["serve_gpu_over_cpu"] = {"measured": ratios, "target": t, "met": min(ratios.values()) >= t}
    tr = data.get("train", {})
    if tr.get("windows_over_cpu") is not None:
        t = TARGETS["train_windows_over_cpu"]
        out["train_windows_over_cpu"] = {
            "measured": tr["windows_over_cpu"],
            "target": t,
            "met": tr["windows_over_cpu"] >= t,
        }
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the JSON file written")
    p.add_argument("--steps", nargs="+", default=["tests", "model", "serve", "train"])
    p.add_argument(
        "--devices", nargs="+", default=["cuda", "cpu"], help="the first is the one measured against the last"
    )
    p.add_argument("--artifact", type=Path, required=True, help="a trained SASRec's version folder (the small catalog)")
    p.add_argument("--items", type=int, default=1_000_000, help="the synthetic catalog's items")
    p.add_argument("--users", type=int, default=100_000, help="the synthetic catalog's users")
    p.add_argument("--events", type=int, default=50, help="each synthetic user's stored items")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per device per load")
    p.add_argument("--rounds", type=int, default=2, help="windows per device per load, alternated")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds at the start of each window")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--client-procs", type=int, default=4)
    p.add_argument("--port", type=int, default=8731)
    p.add_argument("--tests-timeout", type=float, default=240.0)
    p.add_argument("--data", type=Path, help="the training log (Beauty 5-core)")
    p.add_argument("--train-config", type=Path, default=ROOT / "training/configs/sasrec_beauty.toml")
    p.add_argument("--train-minutes", type=float, default=5.0)
    p.add_argument("--train-set", nargs="*", default=[], help="more SECTION.KEY=VALUE for the training job")
    p.add_argument("--cpu-windows-per-s", type=float, default=CPU_WINDOWS_PER_S)
    p.add_argument("--cpu-valid-ndcg", type=float, default=None, help="the CPU's validation NDCG@10 at the same budget")
    p.add_argument("--tiny", action="store_true", help="tiny sizes, short windows: a check that every step runs")
    return p


def main() -> None:
    args = parser().parse_args()
    if args.tiny:
        args.items, args.users, args.events, args.batch, args.repeats = 3000, 300, 20, 16, 3
        args.seconds, args.rounds, args.warmup, args.client_procs = 1.0, 1, 0.2, 1
        args.concurrency = [4]
    threads = max(1, (os.cpu_count() or 1) - 1)  # as a one-worker service sets them (Settings.model_threads)
    torch.set_num_threads(threads)
    report = Report(args.out)
    report.data["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report.step("environment", lambda: environment(args.devices))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models: dict[str, str] = {}
        if {"model", "profile", "serve"} & set(args.steps):
            report.step("catalogs", lambda: models.update(catalogs(args.artifact, root, args)) or dict(models))
        if "tests" in args.steps:
            report.step("tests", lambda: run_tests(args.tests_timeout))
        if "model" in args.steps and models:
            report.step(
                "model", lambda: model_latency(root, models, args.devices, batch=args.batch, repeats=args.repeats)
            )
        if "profile" in args.steps and models:
            report.step("profile", lambda: profile(root, models, args.devices[0], calls=args.repeats))
        if "serve" in args.steps and models:
            report.step("serve", lambda: serve(root, models, args.devices, args))
        if "train" in args.steps:
            report.step("train", lambda: train(args, args.devices[0]))
        report.data["targets"] = targets(report.data, models, args.devices, args)
    report.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report.write()
    print(json.dumps(report.data["targets"], indent=1))


if __name__ == "__main__":
    main()
