"""The one module of the service that touches a server's private code: these limits act
before a request's headers are read, where no documented setting reaches (see
bench/results/http_stack.json), so uvicorn's httptools protocol is subclassed, pinned by
tests/security/test_uvicorn_pin.py to the uvicorn versions it was read against (an upgrade
fails there). Headers over ``max_header_bytes``: 431; not complete in ``header_timeout_s``:
408; a newcomer over ``max_connections`` takes the place of the connection waiting longest
on its client (conn_limits.py; ``limit_concurrency`` acts once headers are read: too late).
"""

from __future__ import annotations

import asyncio

from mla_switchboard.service.api.conn_limits import REFUSED_LINGER_S, Limits
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class GuardedProtocol(HttpToolsProtocol):  # type: ignore[misc]
    """uvicorn's httptools protocol with :class:`Limits` (what it touches: the pin test's)."""

    limits: Limits[GuardedProtocol]
    _header_bytes = 0  # of the request being read, while in its headers
    _in_body = _refused = False
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.limits.admit(self):
            self.limits.wait(self)
            self._arm()
        else:
            self._refuse(self.limits.busy, "refused")

    def connection_lost(self, exc: Exception | None) -> None:
        self.limits.forget(self)
        self._disarm()
        if not self._refused and self._header_bytes > 0:
            self.limits.events.client_gone("in its request headers")
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        most = self.limits.max_header_bytes
        if self._in_body or self._header_bytes + len(data) <= most:
            if not self._in_body and self._header_bytes == 0 and self._timer is None:
                self._arm()
            self._header_bytes += 0 if self._in_body else len(data)
            super().data_received(data)
            return
        # parse what fits; headers still incomplete: refuse before httptools buffers more
        room = most - self._header_bytes
        self._header_bytes = most
        super().data_received(data[:room])
        if self._refused or self.transport.is_closing():
            return
        if self._in_body:  # the rest is body
            super().data_received(data[room:])
        else:
            self._refuse(self.limits.too_large, "header_size", linger=True)

    def on_headers_complete(self) -> None:
        self._in_body, self._header_bytes = True, 0
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_body = False
        if self.cycle is not None and self.cycle.response_complete:
            self.limits.wait(self)  # answered before its body ended: idle now
            self._arm()
        else:
            self.limits.unwait(self)  # being answered: not to displace

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._header_bytes == 0:
            self._disarm()  # idle is timeout_keep_alive's; ours starts at a byte
        if not self.transport.is_closing():
            self.limits.wait(self)

    def displace(self) -> None:
        idle = self._header_bytes == 0 and not self._in_body
        answered = self._in_body and self.cycle is not None and self.cycle.response_started
        self._refuse(None if idle or answered else self.limits.displaced, "evicted")

    def _arm(self) -> None:
        self._disarm()
        self._timer = self.loop.call_later(self.limits.header_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self._in_body or self._refused or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm()  # an answer still being written: the next request waits
        else:
            self._refuse(self.limits.too_slow, "header_timeout", linger=True)

    def _refuse(self, answer: bytes | None, reason: str, *, linger: bool = False) -> None:
        """Close, ``answer`` first (lingering if descriptors allow: read, not reset)."""
        self._refused = True
        self._disarm()
        self.limits.unwait(self)
        self.limits.events.closed(reason)
        if self.transport.is_closing():
            return
        if answer is not None:
            self.transport.write(answer)
        if linger and self.limits.room_to_linger():
            self.flow.pause_reading()
            self.loop.call_later(REFUSED_LINGER_S, self.transport.close)
        else:
            self.transport.close()
