"""Offline jobs: `python -m training train|predict ...`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from training import distributed
from training.config import RunConfig, load_config
from training.data import DataFormatError, load_interactions, locate_ml100k

DEFAULT_SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "ml-100k"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train a model and write an artifact version")
    tr.add_argument("--config", type=Path, required=True, help="TOML run config (training/configs/)")
    tr.add_argument("--data", type=Path, help="data file or folder (overrides data.path)")
    tr.add_argument("--item-table", type=Path, help="item table with release times (CSV/Parquet logs)")
    tr.add_argument("--out", type=Path, default=Path("artifacts"), help="artifacts root")
    tr.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    tr.add_argument("--shared-ml100k", type=Path, default=DEFAULT_SHARED, help=argparse.SUPPRESS)
    pr = sub.add_parser("predict", help="top-K for every user of an artifact, to CSV")
    pr.add_argument("--artifact", type=Path, required=True, help="artifact version folder")
    pr.add_argument("--k", type=int, default=10)
    pr.add_argument("--out", type=Path, default=Path("predictions"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "train":
            return _train(args)
        from training.predict import predict_all

        print(predict_all(args.artifact, args.k, args.out))
        return 0
    except (DataFormatError, ValueError, FileNotFoundError) as exc:
        logging.getLogger("training").error("%s", exc)
        return 2


def _train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    dist = distributed.setup()  # one process, or one rank of a torchrun job
    try:
        return _train_with(args, cfg, dist)
    finally:
        if dist.enabled:
            logging.getLogger("training").info("rank %d of %d finished", dist.rank, dist.world)
        dist.close()


def _train_with(args: argparse.Namespace, cfg: RunConfig, dist: distributed.Dist) -> int:
    from training.recommend import train_recommender

    if cfg.kind == "mhsa":
        from training.next_location import train_next_location

        data_path = args.data or (Path(cfg.data.path) if cfg.data.path else None)
        if data_path is None:
            raise ValueError("no data: pass --data or set data.path")
        train_next_location(cfg, data_path, args.out, dist)
        return 0
    given = args.data or (Path(cfg.data.path) if cfg.data.path else None)
    if cfg.data.name == "ml-100k" and (given is None or given.is_dir()):
        path = locate_ml100k(given, args.shared_ml100k, Path("data") / "ml-100k")
    elif given is None:
        raise ValueError("no data: pass --data or set data.path")
    else:
        path = given
    item_table = args.item_table or (Path(cfg.data.item_table) if cfg.data.item_table else None)
    data = load_interactions(path, item_table)
    train_recommender(cfg, data, args.out, dist)
    return 0


if __name__ == "__main__":
    sys.exit(main())
