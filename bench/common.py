"""What the load benchmarks share: a free loopback port and a pre-encoded select request
(sent raw on a socket, so the client's own HTTP library costs nothing per request)."""

from __future__ import annotations

import json
import socket
from typing import Any


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
