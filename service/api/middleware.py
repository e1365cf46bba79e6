"""Pure ASGI middleware (cheaper per request than Starlette's BaseHTTPMiddleware):
a body size limit that answers 413, and the request latency histogram."""

from __future__ import annotations

import json
import time

from mla_switchboard.service.metrics import Metrics
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimitAndMetrics:
    def __init__(self, app: ASGIApp, *, max_body: int, metrics: Metrics) -> None:
        self.app = app
        self.max_body = max_body
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status = message["status"]
                started = True
            await send(message)

        try:
            length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
            if length is not None and (not length.isdigit() or int(length) > self.max_body):
                await self._too_large(send_wrapper)
                return
            if length is None and scope["method"] in ("POST", "PUT", "PATCH", "DELETE"):
                # A streamed (chunked) body: read it whole, up to the limit, before the
                # app sees it; FastAPI would turn an error raised mid-read into a 400.
                chunks: list[bytes] = []
                seen = 0
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        break
                    chunks.append(message.get("body", b""))
                    seen += len(chunks[-1])
                    if seen > self.max_body:
                        await self._too_large(send_wrapper)
                        return
                    if not message.get("more_body", False):
                        break
                replayed = False

                async def replay() -> Message:
                    nonlocal replayed
                    if not replayed:
                        replayed = True
                        body = b"".join(chunks)
                        return {"type": "http.request", "body": body, "more_body": False}
                    return await receive()

                await self.app(scope, replay, send_wrapper)
            else:
                await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.latency.labels(scope["method"], path, str(status)).observe(
                time.perf_counter() - start
            )

    async def _too_large(self, send: Send) -> None:
        body = json.dumps(
            {"detail": {"message": f"request body over {self.max_body} bytes"}}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
