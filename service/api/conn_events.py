"""What the server's own limits report: the connections they close (a counter by
reason), the clients that go away before their answer (a counter), and the warning
lines about either, one a minute at most, never a traceback. Shared by the ASGI body
deadline (service/api/body_deadline.py) and the connection guard
(service/api/uvicorn_guard.py), so both report alike.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from mla_switchboard.service.metrics import Children, Metrics

QUIET_LOG_S = 60.0

log = logging.getLogger("switchboard.server")


def refusal_body(message: str) -> bytes:
    """The JSON body of an answer the server's limits give instead of a route's."""
    return json.dumps({"detail": {"message": message}}).encode()


class QuietLog:
    """One warning line for the first event of a kind, then at most one every
    ``every_s`` saying how many more there were: a flood of slow or vanishing clients
    must not flood the log (the counters have every one)."""

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = QUIET_LOG_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._every_s = every_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def event(self, kind: str, line: str) -> None:
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._every_s:
            self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
            return
        more = self._unlogged.pop(kind, 0)
        suffix = f" ({more} more since the last such line)" if more else ""
        self._logger.warning("%s%s", line, suffix)
        self._last[kind] = now


class ConnectionEvents:
    """The counters and the quiet log of one server (``metrics`` None: log only)."""

    def __init__(self, metrics: Metrics | None = None, quiet: QuietLog | None = None) -> None:
        self.metrics = metrics
        self.quiet = quiet if quiet is not None else QuietLog(log)
        self._closed = Children(metrics.connections_closed) if metrics is not None else None

    def closed(self, reason: str) -> None:
        """The server closed a connection before (or instead of) its answer."""
        if self._closed is not None:
            self._closed(reason).inc()

    def client_gone(self, what: str) -> None:
        """A client closed its connection before its answer (``what``: the request)."""
        if self.metrics is not None:
            self.metrics.client_disconnects.inc()
        self.quiet.event(
            "client_gone",
            f"a client closed its connection before its answer ({what}); counted in "
            "switchboard_client_disconnects_total",
        )
