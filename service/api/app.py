"""The FastAPI application: wiring only; behaviour lives in the routes and below."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from mla_switchboard.core.version import __version__
from mla_switchboard.service.api.errors import validation_error_response
from mla_switchboard.service.api.headers import EdgeHeaders
from mla_switchboard.service.api.middleware import CLIENT_GONE, BodyLimitAndMetrics
from mla_switchboard.service.api.routes import (
    admin,
    auth,
    backends,
    dashboard,
    events,
    gitops,
    health,
    measurements,
    overrides,
    pods,
    rules,
    select,
    selections,
    sessions,
)
from mla_switchboard.service.api.select_asgi import SELECT_PATH, SelectHandler, is_select
from mla_switchboard.service.config import Settings
from mla_switchboard.service.fleet.groups import OverBudget
from mla_switchboard.service.messages import first_line, redacting_exception_handler
from mla_switchboard.service.priority import answering_a_pod
from mla_switchboard.service.runtime import Runtime
from mla_switchboard.service.store.deadline import StoreDeadline, StoreTimeout
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import compile_path
from starlette.types import Receive, Scope, Send

DESCRIPTION = """\
Fleet-wide choice of the MLA prefill attention backend. Serving pods call
`POST /v1/select` at boot and get a backend with the reason every other candidate
was rejected. See docs/api.md for the contract.
"""


class SwitchboardAPI(FastAPI):
    """The FastAPI app, with ``POST /v1/select`` answered in front of it by a plain ASGI
    handler (service/api/select_asgi.py): the outermost layer a server calls, so the
    hot path skips FastAPI's middleware and routing; every other request, and the
    route's OpenAPI description, are FastAPI's as usual, with the headers of its path
    (``Cache-Control: no-store`` on the API, security headers on the docs: ``edge``,
    service/api/headers.py) set here, outside every middleware and error handler."""

    select_handler: SelectHandler | None = None
    edge: EdgeHeaders | None = None
    store_deadline: StoreDeadline | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_pod_call(scope):
            await self._answer(scope, receive, send)
            return
        with answering_a_pod():  # background threads hand the loop the GIL (priority.py)
            await self._answer(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.select_handler is not None and is_select(scope):
            await self.select_handler(scope, receive, send)
            return
        if self.edge is not None and scope["type"] == "http":
            send = self.edge.wrap(scope, send)
        if self.store_deadline is not None and scope["type"] == "http":
            # every store call this request makes waits at most the deadline
            with self.store_deadline.serving(scope["method"]):
                await super().__call__(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


POD_CALLS = frozenset({SELECT_PATH, "/v1/measurements"})
"""What pods call (a boot's select, a bench's report): while one is answered, the
background threads hand the event loop the GIL between steps
(``priority.answering_a_pod``). A person's or a script's request does not count: a
summary or preview it asks for runs on the fleet-read thread while the loop only waits
for it, and would otherwise turn the hand-over on for that very read."""


def is_pod_call(scope: Scope) -> bool:
    return scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in POD_CALLS


def create_app(settings: Settings | None = None, runtime: Runtime | None = None) -> SwitchboardAPI:
    runtime = runtime or Runtime(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # asyncio prints what nothing awaited by itself: redacted, like every log line
        asyncio.get_running_loop().set_exception_handler(redacting_exception_handler)
        runtime.start()
        watch = asyncio.create_task(_watch_the_loop(runtime))
        try:
            yield
        finally:
            watch.cancel()
            runtime.stop()

    app = SwitchboardAPI(
        title="MLA Switchboard",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served by _offline_docs from packaged assets, not from a CDN
        redoc_url=None,
        # FastAPI's own OpenTelemetry looks up three global providers (environment
        # reads) on every request; the service's observability is its Prometheus
        # metrics, so it is off
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.runtime = runtime
    app.edge = EdgeHeaders(docs_page=_offline_docs(app))
    # first, and on the app's own router: documented first, matched first, without
    # the layers an included router's routes are matched and handled through
    app.router.routes[0:0] = select.lean_router.routes
    for module in (
        select,
        selections,
        pods,
        rules,
        overrides,
        gitops,
        measurements,
        backends,
        admin,
        auth,
        sessions,
        health,
        dashboard,
        events,
    ):
        app.include_router(module.router)
    app.add_exception_handler(HTTPException, _body_errors_as_422)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_errors)  # type: ignore[arg-type]
    app.add_exception_handler(SQLAlchemyError, _store_unavailable)  # type: ignore[arg-type]
    app.add_exception_handler(StoreTimeout, _store_timed_out)  # type: ignore[arg-type]
    app.store_deadline = runtime.store_deadline
    app.add_exception_handler(OverBudget, _over_budget)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnect, _client_gone)  # type: ignore[arg-type]
    app.add_middleware(
        BodyLimitAndMetrics,
        max_body=runtime.settings.max_body_bytes,
        metrics=runtime.metrics,
        larger=dict.fromkeys(gitops.FILE_PATHS, runtime.settings.max_file_bytes),
    )
    app.select_handler = SelectHandler(
        runtime.decider,
        runtime.refused_selects,
        runtime.live,
        runtime.bootstrap_token,
        runtime.wrong_tokens,
        runtime.metrics,
        runtime.settings.max_body_bytes,
        runtime.workload,
    )
    return app


DOCS_ASSETS_URL = "/docs-assets"

# name -> media type: the files that fastapi-offline ships for Swagger UI; served from
# this allowlist, so no request path reaches the file system
DOCS_ASSETS: dict[str, str] = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}


def _offline_docs(app: FastAPI) -> str:
    """``/docs`` (Swagger UI) with every asset served by this process; returns the
    page (built once: its Content-Security-Policy allows its inline script by hash).

    FastAPI's defaults load Swagger UI and ReDoc from a CDN, so on an air-gapped GPU
    cluster ``/docs`` was a blank page. The assets come from the ``fastapi-offline``
    package (installed with the server extra, which keeps them current); only its
    files are used, read once at start. Swagger UI's online validator badge is turned
    off, as it would call out to swagger.io. ReDoc is not offered: its bundle still
    loads its logo from Redocly's CDN, and Swagger UI already shows every operation.
    """
    static = files("fastapi_offline") / "static"
    assets = {name: (static / name).read_bytes() for name in DOCS_ASSETS}
    openapi_url = app.openapi_url or "/openapi.json"
    favicon = f"{DOCS_ASSETS_URL}/favicon.png"

    @app.get(f"{DOCS_ASSETS_URL}/{{name}}", include_in_schema=False)
    async def docs_asset(name: str) -> Response:
        if name not in assets:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return Response(
            assets[name],
            media_type=DOCS_ASSETS[name],
            headers={"Cache-Control": "public, max-age=86400"},
        )

    page = bytes(
        get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} {app.version} - API",
            swagger_js_url=f"{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=favicon,
            swagger_ui_parameters={"validatorUrl": None},
        ).body
    ).decode()

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return HTMLResponse(page)

    return page


async def _validation_errors(request: Request, exc: RequestValidationError) -> Response:
    return validation_error_response(exc.errors())


async def _body_errors_as_422(request: Request, exc: HTTPException) -> Response:
    """FastAPI answers 400 "error parsing the body" for JSON that json.loads cannot take
    (nesting too deep, bad UTF-8); say what is wrong, in the usual 422 shape."""
    cause = exc.__cause__
    if exc.status_code == 400 and cause is not None:
        problem = {
            RecursionError: "JSON nested too deeply",
            UnicodeDecodeError: "body is not valid UTF-8",
        }.get(type(cause), f"body could not be parsed: {type(cause).__name__}")
        if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
            # Python reads at most 4300 digits of an integer (a guard against slow
            # parsing); no field takes a number that long
            problem = "body holds an integer with more digits than any field takes"
        return JSONResponse(
            {"detail": [{"loc": ["body"], "msg": problem, "type": "json_invalid"}]},
            status_code=422,
        )
    if exc.status_code == 405:
        # The router lists only the methods of the first route matching the path
        # (``Allow: GET`` for /v1/rules, which takes PUT too); HTTP wants them all.
        allowed = _allowed_methods(request)
        if allowed:
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(allowed)}
    return await http_exception_handler(request, exc)


def _allowed_methods(request: Request) -> list[str]:
    methods: set[str] = set()
    for template, operations in request.app.openapi()["paths"].items():
        if compile_path(template)[0].match(request.scope["path"]):
            methods.update(m.upper() for m in operations)
    return sorted(methods)


async def _client_gone(request: Request, exc: ClientDisconnect) -> Response:
    """A route reading its body found the client gone: nothing to answer and nothing
    wrong with the service, so no traceback (the server counts the disconnect). The
    status labels the request's latency only; the server sends nothing."""
    return Response(status_code=CLIENT_GONE)


LOOP_WATCH_S = 0.05


async def _watch_the_loop(runtime: Runtime) -> None:
    """Observe how late the event loop runs a 50 ms timer: a request's wait that no
    route's own timing shows (while the loop is held, requests queue in the socket
    before any handler starts its clock)."""
    loop = asyncio.get_running_loop()
    lag = runtime.metrics.loop_lag
    while True:
        started = loop.time()
        await asyncio.sleep(LOOP_WATCH_S)
        lag.observe(max(0.0, loop.time() - started - LOOP_WATCH_S))


async def _over_budget(request: Request, exc: OverBudget) -> Response:
    """A fleet read ran past its time budget: say so and when to retry, rather than
    letting one request hold a worker (and the GIL) indefinitely."""
    return JSONResponse(
        {"detail": {"message": f"{exc}; try again shortly"}},
        status_code=503,
        headers={"Retry-After": "5"},
    )


async def _store_timed_out(request: Request, exc: StoreTimeout) -> Response:
    """The store did not answer within SWITCHBOARD_STORE_DEADLINE_S: 503 at once rather
    than a hung request; the message says whether a write may have been applied."""
    runtime: Runtime = request.app.state.runtime
    runtime.metrics.store_errors.labels(op="request").inc()
    return JSONResponse(
        {"detail": {"message": exc.message, "outcome_unknown": exc.outcome_unknown}},
        status_code=503,
        headers={"Retry-After": str(exc.retry_after_s)},
    )


async def _store_unavailable(request: Request, exc: SQLAlchemyError) -> Response:
    """The database failed under an admin or read request: 503, nothing half-written
    (each write is one transaction). /v1/select never gets here: it runs from memory."""
    runtime: Runtime = request.app.state.runtime
    runtime.metrics.store_errors.labels(op="request").inc()
    return JSONResponse(
        {"detail": {"message": f"store unavailable, nothing was changed: {first_line(exc, 300)}"}},
        status_code=503,
        headers={"Retry-After": "2"},
    )
