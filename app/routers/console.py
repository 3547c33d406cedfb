"""GET /console: a page to look at what a model answers for one user (off with SEQSERVE_CONSOLE=false).

Plain HTML, CSS and JS served from the package: no build step, no CDN, and the page talks to the
service through its public API only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.staticfiles import StaticFiles
from starlette.responses import FileResponse, Response
from starlette.routing import Mount

PAGE = Path(__file__).resolve().parent.parent / "console"
ASSETS = "/console/assets"
# The page's own files and its own origin's API, nothing else; it cannot be framed by another site.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

router = APIRouter()


@router.get("/console", include_in_schema=False)
async def console() -> FileResponse:
    return FileResponse(PAGE / "index.html", headers=HEADERS, media_type="text/html")


class ConsoleFiles(StaticFiles):
    """The page's files with the page's headers: index.html is reachable here too, and must not be
    framed or run another origin's script from this path either."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(HEADERS)
        return response


assets = Mount(ASSETS, app=ConsoleFiles(directory=PAGE), name="console-assets")
