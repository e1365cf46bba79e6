"""A request body's read time, as plain ASGI middleware: any server that speaks ASGI
keeps it, and it needs nothing of the server's insides.

A client that sends its headers and then a byte of its body now and then would hold
its connection, and the route reading that body, for as long as it liked. The body
has ``body_timeout_s`` from the route's first read to its last byte; past that the
client gets a 408 with ``connection: close`` (the server closes the connection after
it, as HTTP/1.1 says), the route's pending read returns ``http.disconnect`` and
whatever the route answers then is dropped. A route that answers before it has read
a body the request declared (a 404 needs none) answers with ``connection: close``
too: nothing would otherwise bound the rest of that body.

A ``http.disconnect`` the middleware did not cause is a client that went away before
its answer: counted and logged quietly (service/api/conn_events.py).
"""

from __future__ import annotations

import asyncio
import time

from mla_switchboard.service.api.conn_events import ConnectionEvents, refusal_body
from mla_switchboard.service.api.headers import NO_STORE
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CLOSE = (b"connection", b"close")
BODY_HEADERS = frozenset({b"content-length", b"transfer-encoding"})


def _declares_body(scope: Scope) -> bool:
    return any(name in BODY_HEADERS and value != b"0" for name, value in scope.get("headers", ()))


def _closing(start: Message) -> Message:
    """``start`` saying ``connection: close`` (once: it may say so already)."""
    headers = list(start.get("headers", ()))
    if any(name.lower() == b"connection" for name, _ in headers):
        return start
    return {**start, "headers": [*headers, CLOSE]}


class _Request:
    """One request's reads and answer, between the server and the app."""

    __slots__ = ("_done", "_limits", "_receive", "_send", "_started", "cut", "scope")

    def __init__(self, limits: BodyDeadline, scope: Scope, receive: Receive, send: Send) -> None:
        self._limits = limits
        self.scope = scope
        self._receive = receive
        self._send = send
        self._done = False  # the whole body read (or the client gone)
        self._started = False  # the app's answer under way
        self.cut = False  # the 408 went instead of the app's answer

    async def receive(self) -> Message:
        if not self._done:
            self._limits.reading(self)
        message = await self._receive()
        if message["type"] == "http.request":
            if message.get("more_body", False):
                return message
        elif message["type"] == "http.disconnect" and not self.cut and not self._done:
            self._limits.events.client_gone(
                f"{self.scope.get('method', '?')} {self.scope.get('path', '?')!a}"
            )
        self._done = True
        self._limits.read(self)
        return message

    async def send(self, message: Message) -> None:
        if self.cut:
            return
        if message["type"] == "http.response.start":
            self._started = True
            if not self._done and _declares_body(self.scope):
                message = _closing(message)
        await self._send(message)

    def expire(self) -> None:
        if self._done or self._started:
            return  # an answer under way closes the connection itself (send)
        self.cut = True
        self._limits.events.closed("body_timeout")
        asyncio.get_running_loop().create_task(self._send_408())

    async def _send_408(self) -> None:
        await self._send(
            {"type": "http.response.start", "status": 408, "headers": self._limits.headers}
        )
        await self._send({"type": "http.response.body", "body": self._limits.body})


class BodyDeadline:
    """ASGI middleware: every HTTP request's body within ``body_timeout_s``.

    One timer for all requests, ticking only while some body is being read: a timer
    per request (set and cancelled around every read) cost 7 us of the ~200 us CPU
    a select takes; a body then times out up to a tick (a tenth of the time) late."""

    def __init__(self, app: ASGIApp, body_timeout_s: float, events: ConnectionEvents) -> None:
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.events = events
        self.body = refusal_body(f"request body not complete within {body_timeout_s:g} s")
        self.headers: list[tuple[bytes, bytes]] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.body)).encode()),
            CLOSE,
            NO_STORE,  # as every API answer (service/api/headers.py)
        ]
        self._tick_s = min(1.0, body_timeout_s / 10)
        self._deadlines: dict[_Request, float] = {}  # oldest first: all have one timeout
        self._ticking = False

    def reading(self, request: _Request) -> None:
        """``request``'s app waits on its body: its clock starts (at its first read)."""
        if request not in self._deadlines:
            self._deadlines[request] = time.monotonic() + self.body_timeout_s
            if not self._ticking:
                self._ticking = True
                asyncio.get_running_loop().call_later(self._tick_s, self._tick)

    def read(self, request: _Request) -> None:
        self._deadlines.pop(request, None)

    def _tick(self) -> None:
        now = time.monotonic()
        while self._deadlines:
            request, deadline = next(iter(self._deadlines.items()))
            if deadline > now:
                break
            del self._deadlines[request]
            request.expire()
        if self._deadlines:
            asyncio.get_running_loop().call_later(self._tick_s, self._tick)
        else:
            self._ticking = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = _Request(self, scope, receive, send)
        try:
            await self.app(scope, request.receive, request.send)
        finally:
            self.read(request)
