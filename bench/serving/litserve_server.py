"""A peer for bench/serving/load.py: the same recommendation artifact served by LitServe instead of the service.

    .venv/bin/pip install -e '.[bench]'   # litserve, pinned in pyproject.toml
    .venv/bin/python -m bench.serving.litserve_server --artifacts artifacts --model sasrec-ml100k --port 8765

Only the framework differs: the LitAPI answers POST /recommend through the project's own engine
(models.tasks.recommend.RecEngine: id mapping, its traced scores, models.ranking.recommend with the same exclusions,
result building), batched by LitServe (max batch 64, 2 ms window by default). It reads the artifact's
stored histories only (no live history store), so it does a little less work per request than the service.
"""

# No `from __future__ import annotations`: LitServe reads decode_request's annotation to take the JSON body.
import argparse
from pathlib import Path
from typing import Any

import litserve as ls
import torch

from models.artifact import latest_versions
from models.engine import EngineOptions
from models.tasks.recommend import RecEngine, RecQuery, RecResult, load_artifact


class RecommendAPI(ls.LitAPI):
    def __init__(self, folder: Path, *, torch_threads: int, **kwargs: Any) -> None:
        super().__init__(api_path="/recommend", **kwargs)
        self.folder = folder
        self.torch_threads = torch_threads

    def setup(self, device: str) -> None:
        torch.set_num_threads(self.torch_threads)
        self.engine = RecEngine(load_artifact(self.folder), EngineOptions(device=torch.device(device)))
        self.engine.warm_up()

    def decode_request(self, request: dict[str, Any]) -> RecQuery:
        q = request["queries"][0]  # the load bench sends one query per request
        return RecQuery(user_id=q.get("user_id"), k=int(q.get("k", 10)))

    def predict(self, batch: list[RecQuery]) -> list[RecResult]:
        return self.engine.answer(batch)

    def encode_response(self, result: RecResult) -> dict[str, Any]:
        return {
            "results": [
                {
                    "user_id": result.user_id,
                    "items": [{"item_id": i, "score": s} for i, s in result.items],
                    "excluded": result.excluded,
                }
            ]
        }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--batch-timeout-ms", type=float, default=2.0)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--accelerator", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--api-servers", type=int, default=1, help="HTTP processes")
    p.add_argument("--workers", type=int, default=1, help="inference processes")
    p.add_argument("--fast-queue", action="store_true", help="LitServe's ZeroMQ request queue")
    args = p.parse_args()
    api = RecommendAPI(
        latest_versions(args.artifacts)[args.model],
        torch_threads=args.torch_threads,
        max_batch_size=args.max_batch,
        batch_timeout=args.batch_timeout_ms / 1000,
    )
    server = ls.LitServer(
        api, accelerator=args.accelerator, workers_per_device=args.workers, fast_queue=args.fast_queue
    )
    server.run(
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        generate_client_file=False,
        num_api_servers=args.api_servers,
    )


if __name__ == "__main__":
    main()
