"""Pure ASGI middleware (cheaper per request than Starlette's BaseHTTPMiddleware): what
every request goes through before a route sees it.

- a body size limit that answers 413 (also for streamed bodies);
- a path with a NUL in it is a 404 here: no route's parameter, and so no store
  query, ever sees one (``GET /v1/selections/abc%00def`` reached PostgreSQL, which
  cannot hold NUL in text, and answered 503 "store unavailable");
- JSON write bodies must be Unicode text: a lone UTF-16 surrogate (``"\\ud800"``, or
  its raw CESU bytes) is valid JSON syntax but no string a store can hold or an
  answer can encode, and is refused with a 422 naming the field;
- a client that goes away while its body is read ends the request there: the route
  never runs on half a body (the body deadline counts the disconnect,
  service/api/body_deadline.py);
- the request latency histogram, with bounded labels (unknown methods are ``OTHER``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from mla_switchboard.service.metrics import Metrics
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The hot path: its body is parsed by pydantic's own JSON parser (jiter), which
# refuses lone surrogates by itself; it is not buffered twice.
UNBUFFERED_PATHS = frozenset({"/v1/select"})
# Answers that stream for minutes (the change stream): their latency is the time to
# their first byte, so that a histogram of request times is not filled with the
# streams' lifetimes.
STREAMED_PATHS = frozenset({"/v1/events"})
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# the status under which a request whose client went away is observed (nginx's
# "client closed request"); never sent
CLIENT_GONE = 499


def lone_surrogate(raw: bytes) -> tuple[list[Any], str] | None:
    """Where a JSON body holds text that is not Unicode: (loc, message), else None.

    Bodies that are not JSON at all are left to the route (it says what is wrong).
    """
    try:
        text = raw.decode("utf-8")  # strict: raw (CESU-8) surrogates fail here
    except UnicodeDecodeError as exc:
        return ["body"], f"body is not valid UTF-8 (byte {exc.start})"
    if "\\u" not in text:
        return None  # no escape sequence, so no lone surrogate either (fast path)
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[Any, list[Any]]] = [(document, ["body"])]
    while stack:  # iterative: the nesting depth is whatever json.loads accepted
        value, loc = stack.pop()
        if isinstance(value, str):
            if not _encodable(value):
                return loc, "string holds a lone UTF-16 surrogate (U+D800-U+DFFF): not text"
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _encodable(key):
                    return loc, "object key holds a lone UTF-16 surrogate: not text"
                stack.append((item, [*loc, key]))
        elif isinstance(value, list):
            stack.extend((item, [*loc, i]) for i, item in enumerate(value))
    return None


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    content = json.dumps(body, ensure_ascii=True).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(content)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": content})


class BodyLimitAndMetrics:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body: int,
        metrics: Metrics,
        larger: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self.max_body = max_body
        self.metrics = metrics
        self.larger = dict(larger or {})  # paths whose bodies may be larger (a whole file)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        started = False
        first_byte: float | None = None

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started, first_byte
            if message["type"] == "http.response.start":
                status = message["status"]
                started = True
                first_byte = time.perf_counter()
            await send(message)

        try:
            if "\x00" in scope["path"]:
                await _answer(
                    send_wrapper, 404, {"detail": {"message": "no such path (it holds a NUL)"}}
                )
                return
            limit = self.larger.get(scope["path"], self.max_body)
            length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
            if length is not None and (not length.isdigit() or int(length) > limit):
                await self._too_large(send_wrapper, limit)
                return
            buffer = scope["path"] not in UNBUFFERED_PATHS and length != b"0"
            if scope["method"] in ("POST", "PUT", "PATCH", "DELETE") and (length is None or buffer):
                # Read the body whole, up to the limit, before the app sees it: a
                # streamed (chunked) one because FastAPI would turn an error raised
                # mid-read into a 400; every JSON one to check that it is text.
                chunks: list[bytes] = []
                seen = 0
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        # The client went away (or the server cut a body that came too
                        # slowly): no one to answer, and a route must not act on half
                        # a body. The server counts it; 499 only labels the latency.
                        status = CLIENT_GONE
                        return
                    chunks.append(message.get("body", b""))
                    seen += len(chunks[-1])
                    if seen > limit:
                        await self._too_large(send_wrapper, limit)
                        return
                    if not message.get("more_body", False):
                        break
                body = b"".join(chunks)
                if body and scope["path"] not in UNBUFFERED_PATHS and _is_json(scope):
                    problem = lone_surrogate(body)
                    if problem is not None:
                        loc, msg = problem
                        await _answer(
                            send_wrapper,
                            422,
                            {"detail": [{"loc": loc, "msg": msg, "type": "string_unicode"}]},
                        )
                        return
                replayed = False

                async def replay() -> Message:
                    nonlocal replayed
                    if not replayed:
                        replayed = True
                        return {"type": "http.request", "body": body, "more_body": False}
                    return await receive()

                await self.app(scope, replay, send_wrapper)
            else:
                await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in METHODS else "OTHER"
            end = time.perf_counter()
            if first_byte is not None and scope["path"] in STREAMED_PATHS:
                end = first_byte
            self.metrics.latency_of(method, path, str(status)).observe(end - start)

    async def _too_large(self, send: Send, limit: int) -> None:
        headers, body = too_large(limit)
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def too_large(max_body: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The 413 answer's headers and body (the connection is closed: the rest of the
    body is not read)."""
    body = json.dumps({"detail": {"message": f"request body over {max_body} bytes"}}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    return headers, body


def _is_json(scope: Scope) -> bool:
    media = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
    media = media.partition(b";")[0].strip().lower()
    # FastAPI reads a body without a content type as JSON too
    return not media or media == b"application/json" or media.endswith(b"+json")
