"""What the load benchmarks share: a free loopback port and a pre-encoded select request
(sent raw on a socket, so the client's own HTTP library costs nothing per request)."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path
from typing import Any


def spill_path_in(log_dir: Path, database_url: str) -> str:
    """Where a bench's service keeps its spill file and decision log: beside its log,
    named after the database as the service's default is (a restart of the same
    database finds it again). The default for a PostgreSQL URL is the working
    directory, the checkout: a bench database dropped and made again under the same
    URL would have a later run take over a log left there and store its decisions."""
    digest = hashlib.sha256(database_url.encode()).hexdigest()[:12]
    return str(log_dir / f"switchboard-spill-{digest}.jsonl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raw_select(body: dict[str, Any], host: str, token: str) -> bytes:
    """One ``POST /v1/select`` as bytes, ready to write on a keep-alive connection."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST /v1/select HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload
