"""``POST /v1/select`` as a plain ASGI handler, answered before FastAPI sees the request.

Every serving pod calls it at boot, thousands at once in a rollout. FastAPI's
middleware stack, router, request and response objects cost more per call than the
decision itself does: served by one process, the leanest FastAPI select route needs
1.25-1.6x the CPU per request of a bare FastAPI endpoint, this handler 0.83-1.02x
(``bench/select_stack.py``, docs/architecture.md, *The HTTP stacks*). So the app
(``SwitchboardAPI`` in service/api/app.py) hands this one method and path to
:class:`SelectHandler` and everything else to FastAPI.

The contract is the FastAPI route's, which stays registered: it documents the route in
the OpenAPI schema, and it is the reference that tests/service/test_select_fast_path.py
compares this handler with, byte for byte. The same checks, in the same order:

1. 413 for a body over the size limit (by ``Content-Length``, or counted as a streamed
   body is read), answered as the body-limit middleware does;
2. 422 for a ``Content-Type`` that is not JSON, then for a body that is not a valid
   request, through the app's own validation-error encoder;
   (and for a ``dry_run`` query parameter that is not a boolean);
3. 401/403 for the token and its role (429 for a wrong token from an address that sent
   too many, service/identity/throttle.py), 403 for a cluster outside its scope, 401/403 for a
   pod that is not the workload token's or a static token in a cluster with a workload
   issuer (``deps.act_as``), each counted per claimed cluster (``service/refused.py``:
   misconfigured pods show);
4. the answer of :func:`select_answer`: 409 refusal, 304 on ``If-None-Match``, or 200
   with ``ETag`` and ``X-Decision-Id``.

Each answer carries ``Cache-Control: no-store``, as every API answer does
(service/api/headers.py), and is observed in ``switchboard_request_seconds`` under
route ``/v1/select``.
The decision path never touches the store, so the store's 503 cannot arise here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from fastapi.exceptions import RequestValidationError
from mla_switchboard.core.schemas import SelectRequest
from mla_switchboard.service.api.deps import (
    act_as,
    authorize,
    client_address,
    verify_workload,
)
from mla_switchboard.service.api.errors import http_error_response, validation_error_response
from mla_switchboard.service.api.headers import NO_STORE
from mla_switchboard.service.api.middleware import CLIENT_GONE, too_large
from mla_switchboard.service.api.routes.select import (
    Headers,
    dry_run_of,
    json_media_errors,
    parse_json_body,
    select_answer,
)
from mla_switchboard.service.deciding import Decider
from mla_switchboard.service.identity.auth import asker_of
from mla_switchboard.service.identity.throttle import FailureThrottle
from mla_switchboard.service.identity.workload import WorkloadVerifier
from mla_switchboard.service.live.poller import LiveConfig
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.refused import RefusedSelects
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

SELECT_PATH = "/v1/select"
Answer = tuple[int, Headers, bytes]

# what Starlette's ServerErrorMiddleware answers for an unexpected exception
SERVER_ERROR: Answer = (
    500,
    [(b"content-length", b"21"), (b"content-type", b"text/plain; charset=utf-8")],
    b"Internal Server Error",
)


class ClientGone(Exception):
    """The client disconnected before its body was read: there is no one to answer."""


def is_select(scope: Scope) -> bool:
    """Whether the lean handler answers this request (every other goes to FastAPI,
    including other methods on the path: 405 with ``Allow: POST``)."""
    return scope["type"] == "http" and scope["path"] == SELECT_PATH and scope["method"] == "POST"


@dataclass(eq=False)
class SelectHandler:
    """The ASGI callable for ``POST /v1/select``; one per app. ``live`` and
    ``bootstrap_token``, ``workload``: the tokens a request is authenticated against;
    ``wrong_tokens``: the per-address throttle of wrong ones (the same as the app's)."""

    decider: Decider
    refused: RefusedSelects
    live: LiveConfig
    bootstrap_token: str | None
    wrong_tokens: FailureThrottle
    metrics: Metrics
    max_body: int
    workload: WorkloadVerifier
    _too_large: Answer = field(init=False)
    _latency: dict[int, Any] = field(init=False, default_factory=dict)  # status -> histogram child

    def __post_init__(self) -> None:
        headers, body = too_large(self.max_body)
        self._too_large = (413, headers, body)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = perf_counter()
        status = 500
        try:
            try:
                answer = await self._answer(scope, receive)
            except ClientGone:
                status = CLIENT_GONE  # observed, never sent: there is no one to send it to
                return
            except Exception:
                await _send(send, SERVER_ERROR)
                raise
            status = answer[0]
            await _send(send, answer)
        finally:
            self._observe(status, perf_counter() - start)

    async def _answer(self, scope: Scope, receive: Receive) -> Answer:
        # Starlette's ``headers.get`` reads the first of repeated headers; so does this
        headers: dict[bytes, bytes] = dict(reversed(scope["headers"]))
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return self._too_large
        raw = await self._read_body(receive)
        if raw is None:
            return self._too_large
        problems = json_media_errors(headers.get(b"content-type", b"").decode("latin-1"))
        if problems is not None:
            return _unpack(validation_error_response(problems))
        try:
            body = parse_json_body(SelectRequest, raw)
            dry_run = dry_run_of(scope["query_string"])
        except RequestValidationError as exc:
            return _unpack(validation_error_response(exc.errors()))
        try:
            authorization = headers.get(b"authorization", b"").decode("latin-1")
            if self.workload.enabled:
                await verify_workload(authorization, self.workload)
            principal = authorize(
                authorization,
                self.live,
                self.bootstrap_token,
                "agent",
                wrong_tokens=self.wrong_tokens,
                client=client_address(scope),
                workload=self.workload,
            )
            body = act_as(principal, body, self.workload, dry_run)
        except HTTPException as exc:
            self.refused.count(body.cluster, exc)
            return _unpack(http_error_response(exc))
        if_none_match = headers.get(b"if-none-match")
        return select_answer(
            self.decider,
            body,
            None if if_none_match is None else if_none_match.decode("latin-1"),
            dry_run,
            asker_of(principal),
            principal,
        )

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it is over the limit (a streamed body is
        counted as it comes, so no more than the limit and one chunk is held)."""
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone
        body: bytes = message.get("body", b"")
        if message.get("more_body", False):
            chunks = [body]
            size = len(body)
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise ClientGone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body:
                    return None
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
        return None if len(body) > self.max_body else body

    def _observe(self, status: int, seconds: float) -> None:
        child = self._latency.get(status)
        if child is None:
            child = self.metrics.latency_of("POST", SELECT_PATH, str(status))
            self._latency[status] = child
        child.observe(seconds)


def _unpack(response: Response) -> Answer:
    return response.status_code, response.raw_headers, bytes(response.body)


async def _send(send: Send, answer: Answer) -> None:
    status, headers, body = answer
    # what the app's edge sets on every other API answer (service/api/headers.py)
    headers = [*headers, NO_STORE]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
