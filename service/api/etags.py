"""ETags and conditional answers (``If-None-Match`` -> 304), shared by the routes.

A dashboard polls the same reads every few seconds; when nothing changed, a 304 with
no body is all it needs, and the page keeps what it shows.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fastapi.responses import JSONResponse, Response


def etag_matches(header: str | None, etag: str) -> bool:
    if header is None:
        return False
    tags = {t.strip().removeprefix("W/") for t in header.split(",")}
    return "*" in tags or etag in tags


def conditional(body: Any, if_none_match: str | None, etag: str | None = None) -> Response:
    """``body`` as JSON with an ETag (its content hash unless given), or 304 when the
    caller already has it."""
    if etag is None:
        text = json.dumps(body, sort_keys=True, default=str).encode()
        etag = '"' + hashlib.blake2b(text, digest_size=12).hexdigest() + '"'
    if etag_matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    return JSONResponse(body, headers={"ETag": etag})
