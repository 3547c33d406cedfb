"""Offline jobs: `python -m training train|copy-task|predict|convert-histories ...`.

`train` reads a run config; the model kind in it names the task, and the task table
(models.tasks.TASKS) names the job. Every job is one skeleton (training/job.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from training import distributed
from training.config import kind_of, read_raw
from training.data import DataFormatError

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
CONFIGS = Path(__file__).resolve().parent / "configs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train a model and write an artifact version")
    tr.add_argument("--config", type=Path, required=True, help="TOML run config (training/configs/)")
    ct = sub.add_parser("copy-task", help="the seq2seq copy task: proves attention, masks and decoding")
    ct.add_argument("--config", type=Path, default=CONFIGS / "copy_task.toml", help="TOML run config")
    for p in (tr, ct):
        p.add_argument("--data", type=Path, help="data file or folder (overrides data.path)")
        p.add_argument("--out", type=Path, help="output root (default: artifacts/, runs/ for the copy task)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
        p.add_argument("--shared-data", type=Path, default=SHARED, help=argparse.SUPPRESS)
    pr = sub.add_parser("predict", help="top-K for every user of a recommendation artifact, to CSV")
    pr.add_argument("--artifact", type=Path, required=True, help="artifact version folder")
    pr.add_argument("--k", type=int, default=10)
    pr.add_argument("--out", type=Path, default=Path("predictions"))
    cv = sub.add_parser(
        "convert-histories",
        help="convert a version written with histories.json to the memory-mapped table (published as a new version)",
    )
    cv.add_argument(
        "artifact",
        type=Path,
        help="artifact version folder, or an artifacts folder: the newest version of each name that needs it",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "predict":
            from training.predict import predict_all

            print(predict_all(args.artifact, k=args.k, out_dir=args.out))
            return 0
        if args.command == "convert-histories":
            from training.convert import convert_histories, convert_root

            if (args.artifact / "manifest.json").is_file():
                print(convert_histories(args.artifact))
            else:
                for folder in convert_root(args.artifact):
                    print(folder)
            return 0
        return _train(args)
    except (DataFormatError, ValueError, FileNotFoundError) as exc:
        logging.getLogger("training").error("%s", exc)
        return 2


def _train(args: argparse.Namespace) -> int:
    from training.jobs import job_for_kind

    raw = read_raw(args.config, args.overrides)
    job_cls = job_for_kind(kind_of(raw))
    if args.command == "copy-task" and job_cls.task != "copy":
        raise ValueError(f"{args.config} is not a copy-task config")
    cfg = job_cls.parse_config(raw)
    dist = distributed.setup(cfg.train.device)
    try:
        job = job_cls(cfg, out_root=args.out, data_path=args.data, dist=dist, shared_data=args.shared_data)
        folder = job.run()
        if folder is not None:
            print(folder)
        return 0
    finally:
        if dist.enabled:
            logging.getLogger("training").info("rank %d of %d finished", dist.rank, dist.world)
        dist.close()


if __name__ == "__main__":
    sys.exit(main())
