"""The machine's ceiling for `bench/serving/load.py --modes raw`: a bare ASGI app under the same uvicorn.

It reads the whole request body and answers one fixed JSON body shaped like the no-op's answer
(ten items), with no framework, no parsing and no validation. The issue's own table measured this
row once (7,470 req/s with h11, 25,103 with httptools at c=64, on a quiet day); served beside the
service in the same run, it tells how fast the machine is at that moment, so the service's
figures can be read against what the box allows.

    .venv/bin/uvicorn --app-dir bench raw_asgi:app --port 8770
"""

from __future__ import annotations

import json
from typing import Any

BODY = json.dumps(
    {
        "model": "raw",
        "version": "0",
        "results": [
            {
                "user_id": "1",
                "items": [{"item_id": str(i), "score": 0.0} for i in range(10)],
                "unknown_items": [],
                "excluded": {"seen": 0, "future": 0, "requested": 0},
                "history_truncated": False,
            }
        ],
    }
).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:  # the whole body, as a real endpoint must read it
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
