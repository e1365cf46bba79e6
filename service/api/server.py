"""The HTTP server's own limits: what a client can make the event loop, and the process's
file descriptors, do before any route (or token check) runs.

uvicorn's httptools protocol bounds none of these. One client sending a 64 MB header to
``/healthz`` kept the event loop busy concatenating it (httptools appends each chunk to
the header value so far: quadratic); a client that never finished its headers, or its
body, held its connection for as long as it liked. 1,100 clients each sending a byte of
a 60,000-byte body every 5 s held every descriptor of a 1,024 limit: ``accept()`` failed,
libuv's answer to that is to accept and close whatever is queued, and 598 of 599
selects on new connections failed. ``GuardedHttpToolsProtocol`` adds:

- **header size**: the request line and headers of one request may take at most
  ``max_header_bytes``; past that the answer is 431 and the connection is closed,
  before httptools has buffered more than one read's worth beyond the limit;
- **header read time**: from the first byte of a request (or the connection's opening)
  to the end of its headers at most ``header_timeout_s``; past that 408 and closed;
- **body read time**: from the end of the headers to the end of the body at most
  ``body_timeout_s``; past that 408 and closed (the route reading the body sees the
  client as gone);
- **open connections**: at most ``max_connections``. A new connection over the limit
  takes the place of the connection that has waited longest on its client (idle
  between requests, or with its request still incomplete), which gets a 503 and is
  closed; only when every connection has a complete request being answered does the
  newcomer get the 503. Refusing newcomers alone would let slow clients keep every
  place, and pods booting would be refused for as long as the slow clients liked.
  uvicorn's ``limit_concurrency`` is no help here: it answers 503 only once a request's
  headers are read (the descriptor is held all along), and logs a warning for each.

Connections the server closes before an answer are counted in
``switchboard_connections_closed_total{reason}``; clients that go away before their
answer in ``switchboard_client_disconnects_total``. Either gets one warning line a
minute at most, never a traceback. Idle keep-alive connections are uvicorn's own
``timeout_keep_alive`` (5 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any

from mla_switchboard.service.config import Settings
from mla_switchboard.service.metrics import Children, Metrics

REFUSED_LINGER_S = 0.25
QUIET_LOG_S = 60.0
# descriptors kept free of connections: the database pool (PostgreSQL: 20; SQLite: a
# few files per connection), log and spill files, the listening socket, the event loop's
# own, and room for a burst that libuv accepts before any connection is counted
FD_RESERVE = 100

log = logging.getLogger("switchboard.server")


def _response(status: int, reason: str, message: str, *, retry_after: int | None = None) -> bytes:
    body = json.dumps({"detail": {"message": message}}).encode()
    retry = f"retry-after: {retry_after}\r\n" if retry_after is not None else ""
    return (
        f"HTTP/1.1 {status} {reason}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        f"{retry}"
        "connection: close\r\n\r\n"
    ).encode() + body


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


class ConnectionLimits:
    """What one server's connections share: the connection limit, the connections that
    wait on their client (oldest first: the ones a newcomer may take the place of),
    the counters and the quiet log."""

    def __init__(self, max_connections: int | None, metrics: Metrics | None = None) -> None:
        self.max_connections = max_connections
        self.waiting: OrderedDict[Any, None] = OrderedDict()
        self.quiet = QuietLog(log)
        self._metrics = metrics
        self._closed = Children(metrics.connections_closed) if metrics is not None else None
        self._watching: Collection[Any] | None = None

    def watch(self, connections: Collection[Any]) -> None:
        """Report the server's set of open connections as a gauge (read at scrape time,
        so opening a connection costs nothing more)."""
        if self._watching is None:
            self._watching = connections
            if self._metrics is not None:
                self._metrics.connections_open.set_function(lambda: len(connections))

    def over(self, open_now: int) -> bool:
        return self.max_connections is not None and open_now > self.max_connections

    def room_to_linger(self, open_now: int) -> bool:
        """Whether a refused connection may stay open a moment (so its client reads the
        answer rather than a reset); not when its descriptor is needed."""
        return self.max_connections is None or open_now < self.max_connections

    def wait(self, conn: Any) -> None:
        """``conn`` now waits on its client (a request's first byte, or the rest of it)."""
        self.waiting[conn] = None
        self.waiting.move_to_end(conn)

    def unwait(self, conn: Any) -> None:
        self.waiting.pop(conn, None)

    def oldest_waiting(self) -> Any | None:
        for conn in self.waiting:
            return conn
        return None

    def closed(self, reason: str) -> None:
        if self._closed is not None:
            self._closed(reason).inc()

    def client_gone(self, what: str) -> None:
        if self._metrics is not None:
            self._metrics.client_disconnects.inc()
        self.quiet.event(
            "client_gone",
            f"a client closed its connection before its answer ({what}); counted in "
            "switchboard_client_disconnects_total",
        )


def guarded_protocol(
    max_header_bytes: int,
    header_timeout_s: float,
    body_timeout_s: float = 10.0,
    max_connections: int | None = None,
    metrics: Metrics | None = None,
) -> type[Any]:
    """An ``HttpToolsProtocol`` subclass with these limits, for ``uvicorn.run(http=...)``;
    its connections share one :class:`ConnectionLimits` (one class per server)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    limits = ConnectionLimits(max_connections, metrics)
    too_large = _response(
        431, "Request Header Fields Too Large", f"request headers over {max_header_bytes} bytes"
    )
    headers_too_slow = _response(
        408, "Request Timeout", f"request headers not complete within {header_timeout_s:g} s"
    )
    body_too_slow = _response(
        408, "Request Timeout", f"request body not complete within {body_timeout_s:g} s"
    )
    busy = _response(
        503,
        "Service Unavailable",
        f"server at its connection limit ({max_connections}), every connection busy; retry",
        retry_after=1,
    )
    displaced = _response(
        503,
        "Service Unavailable",
        f"server at its connection limit ({max_connections}): this request was not complete "
        "and a new connection took its place; retry",
        retry_after=1,
    )

    class GuardedHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_headers = True  # reading a request line and headers
            self._header_bytes = 0
            self._header_timer: asyncio.TimerHandle | None = None
            self._in_body = False  # headers read, body not complete
            self._body_timer: asyncio.TimerHandle | None = None
            self._refused = False  # the server closes this connection: no more reading

        # ------------------------------------------------------------ connections

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            limits.watch(self.connections)
            if limits.over(len(self.connections)):
                victim = limits.oldest_waiting()
                if victim is None:
                    self._refuse(busy, "refused")
                    limits.quiet.event(
                        "refused",
                        f"connection limit ({max_connections}) reached with every connection "
                        "busy: new connections refused with 503",
                    )
                    return
                victim._displace()
                limits.quiet.event(
                    "displaced",
                    f"connection limit ({max_connections}) reached: connections waiting on "
                    "their client closed (503) to make room for new ones",
                )
            self._arm()
            limits.wait(self)

        def connection_lost(self, exc: Exception | None) -> None:
            limits.unwait(self)
            self._disarm()
            self._disarm_body()
            if not self._refused and self._mid_request():
                scope = self.scope or {}
                limits.client_gone(f"{scope.get('method', '?')} {scope.get('path', '?')!a}")
            super().connection_lost(exc)

        def shutdown(self) -> None:
            if self.cycle is None or self.cycle.response_complete:
                self._refused = True  # closed by the server, not gone by the client
            super().shutdown()

        def _mid_request(self) -> bool:
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                return True
            return self._in_headers and self._header_bytes > 0

        def _waiting_on_client(self) -> bool:
            """Idle, or reading a request whose body has not all come: nothing of this
            connection is being answered."""
            cycle = self.cycle
            return cycle is None or cycle.response_complete or cycle.more_body

        def _displace(self) -> None:
            """Make room for a new connection: 503 for an incomplete request, nothing
            for an idle connection (no request to answer); closed at once."""
            idle = (self.cycle is None or self.cycle.response_complete) and (
                self._header_bytes == 0
            )
            self._abort(None if idle else displaced, "evicted")

        # ------------------------------------------------------------ reading

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self._in_headers:
                self._header_bytes += len(data)
                if self._header_timer is None:
                    self._arm()
                if self._header_bytes > max_header_bytes:
                    # Parse only what fits under the limit (the rest of this read could
                    # be a body after the headers' end); if the headers are still not
                    # complete, refuse before httptools buffers any more.
                    room = len(data) - (self._header_bytes - max_header_bytes)
                    if room > 0:
                        self._parse(data[:room])
                        if self._refused or self.transport.is_closing():
                            return
                    if self._in_headers:
                        self._refuse(too_large, "header_size", linger=True)
                        return
                    self._parse(data[max(room, 0) :])
                    return
            self._parse(data)

        def _parse(self, data: bytes) -> None:
            super().data_received(data)
            # The body's clock starts when the headers are done; a body that came
            # whole with them (every ordinary request) never sets a timer.
            if self._in_body and self._body_timer is None and not self._refused:
                self._body_timer = self.loop.call_later(body_timeout_s, self._body_timed_out)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_headers = True

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._header_bytes = 0
            self._disarm()
            self._in_body = True
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_body = False
            self._disarm_body()
            # the next bytes on this connection start a new request line
            self._in_headers = True
            self._header_bytes = 0
            if self.cycle is not None and self.cycle.response_complete:
                # answered before its body ended (a 404 needs no body): idle now, and
                # nothing else would close it (uvicorn's keep-alive timer was stopped
                # by the body's bytes)
                self._arm()
                limits.wait(self)
            else:
                limits.unwait(self)  # complete: being answered, not to be displaced

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # idle between requests is timeout_keep_alive's; ours starts at the
            # next request's first byte (data_received arms it)
            if self._header_bytes == 0:
                self._disarm()
            if not self.transport.is_closing() and self._waiting_on_client():
                limits.wait(self)

        # ------------------------------------------------------------ timers

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._timed_out)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _disarm_body(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _timed_out(self) -> None:
            self._header_timer = None
            if self._in_headers and not self.transport.is_closing():
                if self.cycle is None or self.cycle.response_complete:
                    self._refuse(headers_too_slow, "header_timeout", linger=True)
                else:
                    # A response is still being written on this connection: the next
                    # request's headers get their full time once it is done.
                    self._arm()

        def _body_timed_out(self) -> None:
            self._body_timer = None
            if not self._in_body or self._refused or self.transport.is_closing():
                return
            if self.flow.read_paused:
                # the server stopped reading (a pipelined request waits its turn, or
                # the route has not taken the body so far): not the client's delay
                self._body_timer = self.loop.call_later(body_timeout_s, self._body_timed_out)
                return
            self._abort(body_too_slow, "body_timeout", linger=True)

        # ------------------------------------------------------------ closing

        def _abort(self, answer: bytes | None, reason: str, *, linger: bool = False) -> None:
            """Close a connection whose request may be in a route's hands: the route
            reading its body sees the client as gone, and what it answers is dropped."""
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                if cycle.response_started:
                    answer = None  # a response is under way: nothing can follow it
                cycle.disconnected = True
                cycle.message_event.set()
            self._refuse(answer, reason, linger=linger)

        def _refuse(self, answer: bytes | None, reason: str, *, linger: bool = False) -> None:
            self._refused = True
            self._disarm()
            self._disarm_body()
            limits.unwait(self)
            limits.closed(reason)
            if self.transport.is_closing():
                return
            if answer is not None:
                self.transport.write(answer)
            if linger and limits.room_to_linger(len(self.connections)):
                # Read no more, and close a moment later rather than at once: closing
                # with unread bytes pending resets the connection, and the client may
                # lose the answer; and a client that reconnects as soon as it is cut
                # off (a loop of oversized requests) is paced to a few a second.
                self.flow.pause_reading()
                self.loop.call_later(REFUSED_LINGER_S, self.transport.close)
            else:
                self.transport.close()

    return GuardedHttpToolsProtocol


def descriptor_limit() -> int | None:
    """The process's soft limit on open descriptors (None: unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def effective_max_connections(configured: int, fd_limit: int | None) -> int:
    """``configured``, or less when the descriptor limit cannot hold that many
    connections beside the database pool and files (``FD_RESERVE``)."""
    if fd_limit is None:
        return configured
    return max(1, min(configured, fd_limit - FD_RESERVE))


def server_options(settings: Settings, metrics: Metrics | None = None) -> dict[str, Any]:
    """The ``uvicorn.run`` keyword arguments that bound what a client can hold."""
    fd_limit = descriptor_limit()
    max_connections = effective_max_connections(settings.max_connections, fd_limit)
    if max_connections < settings.max_connections:
        log.warning(
            "SWITCHBOARD_MAX_CONNECTIONS=%d does not fit the descriptor limit (ulimit -n %d, "
            "%d kept for the database and files): at most %d connections",
            settings.max_connections,
            fd_limit,
            FD_RESERVE,
            max_connections,
        )
    try:
        protocol: Any = guarded_protocol(
            settings.max_header_bytes,
            settings.header_timeout_s,
            settings.body_timeout_s,
            max_connections,
            metrics,
        )
    except ImportError:  # no httptools: h11 bounds the header buffer by itself
        return {
            "http": "h11",
            "h11_max_incomplete_event_size": settings.max_header_bytes,
            "limit_concurrency": max_connections,
        }
    return {"http": protocol}
