"""GET /console: a page to look at what a model answers for one user (off with SEQSERVE_CONSOLE=false).

Plain HTML, CSS and JS served from the package: no build step, no CDN, and the page talks to the
service through its public API only."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.staticfiles import StaticFiles
from starlette.responses import FileResponse
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


assets = Mount(ASSETS, app=StaticFiles(directory=PAGE), name="console-assets")
