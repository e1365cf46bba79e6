"""The connection limits' shared state and answers (service/api/uvicorn_guard.py acts
on them): plain Python, nothing of the server's.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from mla_switchboard.service.api.conn_events import ConnectionEvents, refusal_body


class Displaceable(Protocol):
    def displace(self) -> None:
        """Close to make room for a newcomer (503 if it had asked something)."""


C = TypeVar("C", bound=Displaceable)

REFUSED_LINGER_S = 0.25


def raw_answer(status: int, reason: str, message: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer that closes its connection, written before any route.

    It carries the headers every API answer does (no-store, nosniff): a refusal written
    here never passes the middleware that adds them."""
    body = refusal_body(message)
    retry = f"retry-after: {retry_after}\r\n" if retry_after is not None else ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        "cache-control: no-store\r\nx-content-type-options: nosniff\r\n"
    )
    tail = f"content-length: {len(body)}\r\n{retry}connection: close\r\n\r\n"
    return (head + tail).encode() + body


@dataclass(eq=False)
class Limits(Generic[C]):
    """What one server's connections share: the limits, their answers, the open
    connections and those waiting on their client (oldest first)."""

    max_header_bytes: int
    header_timeout_s: float
    max_connections: int | None
    events: ConnectionEvents
    opened: set[C] = field(init=False, default_factory=set)
    waiting: OrderedDict[C, None] = field(init=False, default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.limit = f"server at its connection limit ({self.max_connections})"
        self.too_large = raw_answer(
            431,
            "Request Header Fields Too Large",
            f"request headers over {self.max_header_bytes} bytes",
        )
        self.too_slow = raw_answer(
            408,
            "Request Timeout",
            f"request headers not complete within {self.header_timeout_s:g} s",
        )
        self.busy = raw_answer(
            503, "Service Unavailable", f"{self.limit}, every connection busy; retry", 1
        )
        self.displaced = raw_answer(
            503,
            "Service Unavailable",
            f"{self.limit}: this request was not complete and a new connection took its "
            "place; retry",
            1,
        )

    def room_to_linger(self) -> bool:
        return self.max_connections is None or len(self.opened) < self.max_connections

    def wait(self, conn: C) -> None:
        """``conn`` now waits on its client: the newest such."""
        self.waiting[conn] = None
        self.waiting.move_to_end(conn)

    def unwait(self, conn: C) -> None:
        self.waiting.pop(conn, None)

    def forget(self, conn: C) -> None:
        self.opened.discard(conn)
        self.waiting.pop(conn, None)

    def admit(self, conn: C) -> bool:
        """Count ``conn`` as open. Over the limit, the connection that has waited longest
        on its client makes room for it; False when none does (every one is being
        answered): ``conn`` is to be refused."""
        self.opened.add(conn)
        if self.max_connections is None or len(self.opened) <= self.max_connections:
            return True
        if not self.waiting:
            self.events.quiet.event(
                "refused",
                f"{self.limit} with every connection busy: new connections refused with 503",
            )
            return False
        next(iter(self.waiting)).displace()
        self.events.quiet.event(
            "displaced",
            f"{self.limit}: connections waiting on their client closed (503) to make room "
            "for new ones",
        )
        return True
