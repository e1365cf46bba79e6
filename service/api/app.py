"""The FastAPI application: wiring only; behaviour lives in the routes and below."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from service.api.middleware import BodyLimitAndMetrics
from service.api.routes import admin, health, overrides, rules, select, selections
from service.config import Settings
from service.runtime import Runtime

DESCRIPTION = """\
Fleet-wide choice of the MLA prefill attention backend. Serving pods call
`POST /v1/select` at boot and get a backend with the reason every other candidate
was rejected. See docs/api.md for the contract.
"""


def create_app(settings: Settings | None = None, runtime: Runtime | None = None) -> FastAPI:
    runtime = runtime or Runtime(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime.start()
        try:
            yield
        finally:
            runtime.stop()

    app = FastAPI(
        title="MLA Switchboard",
        version="1.0.0",
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.include_router(select.lean_router)  # first: the hot path is matched first
    for module in (select, selections, rules, overrides, admin, health):
        app.include_router(module.router)
    app.add_exception_handler(HTTPException, _body_errors_as_422)  # type: ignore[arg-type]
    app.add_middleware(
        BodyLimitAndMetrics, max_body=runtime.settings.max_body_bytes, metrics=runtime.metrics
    )
    return app


async def _body_errors_as_422(request: Request, exc: HTTPException) -> Response:
    """FastAPI answers 400 "error parsing the body" for JSON that json.loads cannot take
    (nesting too deep, bad UTF-8); say what is wrong, in the usual 422 shape."""
    cause = exc.__cause__
    if exc.status_code == 400 and cause is not None:
        problem = {
            RecursionError: "JSON nested too deeply",
            UnicodeDecodeError: "body is not valid UTF-8",
        }.get(type(cause), f"body could not be parsed: {type(cause).__name__}")
        return JSONResponse(
            {"detail": [{"loc": ["body"], "msg": problem, "type": "json_invalid"}]},
            status_code=422,
        )
    return await http_exception_handler(request, exc)
