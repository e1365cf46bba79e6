"""The HTTP server's own limits: what a client can make the event loop do before any
route (or token check) runs.

uvicorn's httptools protocol reads headers without bound: one client sending a 64 MB
header to ``/healthz`` kept the event loop busy concatenating it (httptools appends
each chunk to the header value so far: quadratic) and pushed ``/v1/select`` p99 past a
second; a client that never finishes its headers held its connection for as long as it
liked (issue 13). ``GuardedHttpToolsProtocol`` adds the two limits uvicorn lacks:

- **header size**: the request line and headers of one request may take at most
  ``max_header_bytes``; past that the answer is 431 and the connection is closed,
  before httptools has buffered more than one read's worth beyond the limit;
- **header read time**: from the first byte of a request (or the connection's opening)
  to the end of its headers at most ``header_timeout_s``; past that 408 and closed.

Idle keep-alive connections are uvicorn's own ``timeout_keep_alive`` (5 s).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mla_switchboard.service.config import Settings

REFUSED_LINGER_S = 0.25


def _response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"detail": {"message": message}}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + body


def guarded_protocol(max_header_bytes: int, header_timeout_s: float) -> type[Any]:
    """An ``HttpToolsProtocol`` subclass with these limits, for ``uvicorn.run(http=...)``."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    too_large = _response(
        431, "Request Header Fields Too Large", f"request headers over {max_header_bytes} bytes"
    )
    too_slow = _response(
        408, "Request Timeout", f"request headers not complete within {header_timeout_s:g} s"
    )

    class GuardedHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_headers = True  # reading a request line and headers
            self._header_bytes = 0
            self._header_timer: asyncio.TimerHandle | None = None
            self._refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

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
                        super().data_received(data[:room])
                        if self._refused or self.transport.is_closing():
                            return
                    if self._in_headers:
                        self._refuse(too_large)
                        return
                    super().data_received(data[max(room, 0) :])
                    return
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_headers = True

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._header_bytes = 0
            self._disarm()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            # the next bytes on this connection start a new request line
            self._in_headers = True
            self._header_bytes = 0

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._timed_out)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _timed_out(self) -> None:
            self._header_timer = None
            if self._in_headers and not self.transport.is_closing():
                if self.cycle is None or self.cycle.response_complete:
                    self._refuse(too_slow)
                else:
                    # A response is still being written on this connection: the next
                    # request's headers get their full time once it is done.
                    self._arm()

        def _refuse(self, answer: bytes) -> None:
            self._refused = True
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(answer)
                # Read no more, and close a moment later rather than at once: closing
                # with unread bytes pending resets the connection, and the client may
                # lose the answer; and a client that reconnects as soon as it is cut
                # off (a loop of oversized requests) is paced to a few a second.
                self.transport.pause_reading()
                self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # idle between requests is timeout_keep_alive's; ours starts at the
            # next request's first byte (data_received arms it)
            if self._header_bytes == 0:
                self._disarm()

    return GuardedHttpToolsProtocol


def server_options(settings: Settings) -> dict[str, Any]:
    """The ``uvicorn.run`` keyword arguments that bound what a client can hold."""
    try:
        protocol: Any = guarded_protocol(settings.max_header_bytes, settings.header_timeout_s)
    except ImportError:  # no httptools: h11 bounds the header buffer by itself
        return {"http": "h11", "h11_max_incomplete_event_size": settings.max_header_bytes}
    return {"http": protocol}
