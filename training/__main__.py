"""Offline jobs: `python -m training train|defaults|predict|convert-histories|<a task's command> ...`.

`train` reads a run config; the model kind in it names the task (models.tasks.TASKS), and the
task's registered training side (training.jobs.JOBS) its job. Every job is one skeleton
(training/job.py). A task with a command of its own (the copy task's `copy-task`) gets it with
its default config; `defaults` trains every task's default models.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from models.artifact import read_manifest
from models.tasks import TASKS
from training import distributed
from training.config import apply_override, kind_of, read_raw
from training.data import DataFormatError
from training.job import peak_rss_gb
from training.jobs import JOBS, job_for_kind

ROOT = Path(__file__).resolve().parent.parent
# A warm retrain is held back under this share of its parent's figure against the best baseline: ml-100k's
# ratio moves by a few percent between seeds, a broken or flooded retrain falls far below it
# (docs/BENCHMARKS.md, the warm retrain).
WARM_GATE = 0.8
# A cold version is held back under its run's best simple baseline when an earlier version of its name is
# there to serve (docs/decisions/cold-gate.md).
COLD_GATE = 1.0
SHARED = ROOT.parent / "shared" / "data"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train a model and write an artifact version")
    tr.add_argument("--config", type=Path, required=True, help="TOML run config (training/configs/)")
    runs = [tr]
    for row in JOBS.values():
        if row.command:
            own = sub.add_parser(row.command, help=f"train the {row.task} task with its default config")
            own.add_argument("--config", type=Path, default=ROOT / (row.config or ""), help="TOML run config")
            own.set_defaults(task=row.task)
            runs.append(own)
    for p in runs:
        p.add_argument("--data", type=Path, help="data file or folder (overrides data.path)")
        p.add_argument("--out", type=Path, help="output root (default: artifacts/, or the job's own)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
        p.add_argument("--shared-data", type=Path, default=SHARED, help=argparse.SUPPRESS)
        p.add_argument(
            "--gate",
            type=float,
            default=COLD_GATE,
            help="hold the new version back (under <artifacts>/.held, exit 3) when its test figure is under this "
            "times its best baseline's and an earlier version of its name is there to serve (default "
            f"{COLD_GATE}; 0: never; the first version is published and the service warns)",
        )
    df = sub.add_parser("defaults", help="train every task's default models whose data is there")
    df.add_argument("--out", type=Path, default=Path("artifacts"), help="artifacts folder")
    df.add_argument("--task", dest="tasks", action="append", choices=sorted(TASKS), help="only these tasks'")
    pr = sub.add_parser("predict", help="top-K for every stored user of an artifact, to CSV")
    pr.add_argument("--artifact", type=Path, required=True, help="artifact version folder")
    pr.add_argument("--k", type=int, default=10)
    pr.add_argument("--out", type=Path, default=Path("predictions"))
    pr.add_argument(
        "--filter", type=Path, help="a JSON file holding a filter, as /recommend's queries take it (docs/API.md)"
    )
    pr.add_argument(
        "--hidden",
        type=Path,
        help="items no list may hold: a JSON file as GET /models/{name}/items/hidden answers, or one id a line",
    )
    cv = sub.add_parser(
        "convert-histories",
        help="convert a version written with histories.json to the memory-mapped table (published as a new version)",
    )
    cv.add_argument(
        "artifact",
        type=Path,
        help="artifact version folder, or an artifacts folder: the newest version of each name that needs it",
    )
    wm = sub.add_parser(
        "warm",
        help="continue a served version's training on new data (its log plus the live events since), as a new version",
    )
    wm.add_argument("--artifact", type=Path, required=True, help="a version folder, or a model's folder (its newest)")
    wm.add_argument(
        "--data", type=Path, required=True, help="the log to continue on (python -m retrainer.export_history)"
    )
    wm.add_argument("--minutes", type=float, default=0.5, help="the training loop's budget (train.max_minutes)")
    wm.add_argument("--out", type=Path, help="artifacts folder (default: the one holding --artifact)")
    wm.add_argument(
        "--gate",
        type=float,
        default=WARM_GATE,
        help="hold the new version back (under <artifacts>/.held, exit 3) when its test figure against the best "
        f"baseline is under this share of the version it started from (default {WARM_GATE}; 0: never)",
    )
    wm.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "predict":
            from training.predict import predict_all, read_hidden

            rule = json.loads(args.filter.read_text()) if args.filter else None
            hidden = read_hidden(args.hidden) if args.hidden else []
            print(predict_all(args.artifact, k=args.k, out_dir=args.out, rule=rule, hidden=hidden))
            return 0
        if args.command == "defaults":
            return train_defaults(args.out, tasks=args.tasks)
        if args.command == "convert-histories":
            from training.convert import convert_histories, convert_root

            if (args.artifact / "manifest.json").is_file():
                print(convert_histories(args.artifact))
            else:
                for folder in convert_root(args.artifact):
                    print(folder)
            return 0
        if args.command == "warm":
            return _warm(args)
        return _train(args)
    except (DataFormatError, ValueError, FileNotFoundError) as exc:
        logging.getLogger("training").error("%s", exc)
        return 2


def _train(args: argparse.Namespace) -> int:

    raw = read_raw(args.config, args.overrides)
    job_cls = job_for_kind(kind_of(raw))
    own = getattr(args, "task", None)
    if own is not None and job_cls.task != own:
        raise ValueError(f"{args.config} is not a config of the {own} task")
    cfg = job_cls.parse_config(raw)
    dist = distributed.setup(cfg.train.device)
    try:
        job = job_cls(
            cfg, out_root=args.out, data_path=args.data, dist=dist, shared_data=args.shared_data, cold_gate=args.gate
        )
        folder = job.run()
        dist.finish()
        if folder is not None:
            print(folder)
            if "held_back" in read_manifest(folder).metrics:
                return 3  # written aside, never published
        return 0
    finally:
        # Each rank's own peak (a process alone is rank 0 of 1): what reading a share of the log saves.
        log = logging.getLogger("training")
        log.info("rank %d of %d finished, peak RSS %.2f GB", dist.rank, dist.world, peak_rss_gb())
        dist.close()


def _warm(args: argparse.Namespace) -> int:
    """The served version's own run config, on the new data, within the new budget, from its weights."""
    import json

    from models.artifact import versions

    folder = args.artifact if (args.artifact / "manifest.json").is_file() else next(iter(versions(args.artifact)), None)
    if folder is None:
        raise FileNotFoundError(f"{args.artifact}: no artifact version there")
    raw = json.loads((folder / "run_config.json").read_text())
    kind = raw.get("kind") or raw["model"].get("kind")
    raw = {k: raw[k] for k in ("name", "model", "data", "train", "eval") if k in raw}
    raw["model"] = {**raw["model"], "kind": kind}
    raw["data"] = {**raw.get("data", {}), "path": str(args.data)}
    if "item_table" in raw["data"]:  # the new log brings none: item fields come from the served version
        raw["data"]["item_table"] = ""
    raw["train"] = {**raw.get("train", {}), "max_minutes": args.minutes}
    for o in args.overrides:
        apply_override(raw, o)
    job_cls = job_for_kind(kind_of(raw))
    cfg = job_cls.parse_config(raw)
    job = job_cls(
        cfg, out_root=args.out or folder.parent.parent, data_path=args.data, warm_from=folder, warm_gate=args.gate
    )
    out = job.run()
    if out is not None:
        print(out)
        if "held_back" in read_manifest(out).metrics:
            return 3  # written aside, never published: the caller must not reload for it
    return 0


def train_defaults(out: Path, *, tasks: list[str] | None = None) -> int:
    """Train each task's default runs (training.jobs.DefaultRun) into `out` (only `tasks`' when given);
    a run whose data file is not there is skipped, and the log says which task stays without a model."""
    log = logging.getLogger("training")
    failed = 0
    for row in JOBS.values():
        if tasks and row.task not in tasks:
            continue
        for run in row.defaults:
            config = ROOT / run.config
            data = os.environ.get(run.data_env)
            configured = read_raw(config, []).get("data", {}).get("path")
            path = Path(data) if data else (ROOT / configured if configured else None)
            if path is not None and not path.exists():
                log.warning("%s not found (set %s): no %s model is trained", path, run.data_env, row.task)
                continue
            log.info("training %s", run.what or run.config)
            argv = ["train", "--config", str(config), "--out", str(out), *(["--data", str(path)] if path else [])]
            code = main([*argv, *(a for o in run.overrides for a in ("--set", o))])
            failed += code not in (0, 3)  # 3: held back under its baseline, an earlier version serving (logged)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
