"""The dashboard: a static page shell at ``GET /`` and its assets under ``/static/``.

The shell holds no data and is open without a token; the page asks for a
viewer token and reads the JSON API with it. Assets are served from a fixed allowlist
rather than a directory mount, so no request path ever reaches the file system, and
every answer carries a strict Content-Security-Policy: scripts and styles only from
this origin, no inline script, no framing, fetches only to this origin (the headers
every page of the service carries: service/api/headers.py).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response
from mla_switchboard.service.api.deps import fail
from mla_switchboard.service.api.headers import SECURITY_HEADERS

STATIC_DIR = Path(__file__).resolve().parent.parent.parent / "static"

# name -> media type; anything else under /static/ is a 404
ASSETS: dict[str, str] = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "pods.js": "text/javascript; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "layout.js": "text/javascript; charset=utf-8",
    "live.js": "text/javascript; charset=utf-8",
    "a11y.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

# the shell and assets are small: always revalidated, so a deploy shows at once
HEADERS: dict[str, str] = {**SECURITY_HEADERS, "Cache-Control": "no-cache"}

router = APIRouter(include_in_schema=False)


def _read(name: str) -> bytes:
    # Read per request: a few KiB, and edits show up without a restart.
    return (STATIC_DIR / name).read_bytes()


@router.get("/", response_class=HTMLResponse)
async def index() -> HTMLResponse:
    return HTMLResponse(_read("index.html"), headers=HEADERS)


@router.get("/static/{name}")
async def asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        fail(404, f"no asset {name!r}")
    return Response(_read(name), media_type=media_type, headers=HEADERS)
