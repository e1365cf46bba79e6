"""Probes and metrics: the only routes open without a token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from mla_switchboard.service.api.deps import RuntimeDep, metrics_scope
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Rules are in memory: ready to answer /v1/select",
    responses={503: {"description": "no rules loaded yet"}},
)
async def readyz(runtime: RuntimeDep) -> Response:
    """Ready while rules are in memory, even if the database blips: emptying the load
    balancer because the store is down would turn a degraded service into an outage.
    The store's state is reported in the body (and in metrics)."""
    snap = runtime.live.snapshot
    degraded = runtime.degraded()
    body: dict[str, Any] = {
        "status": "ready" if snap is not None else "not ready",
        "rules_revision": None if snap is None else snap.rules.revision,
        "config_version": None if snap is None else snap.version,
        "store": "degraded" if degraded else "ok",
        "store_error": degraded,
        "decisions_buffered": runtime.recorder.pending,
    }
    return JSONResponse(body, status_code=200 if snap is not None else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={401: {"description": "SWITCHBOARD_METRICS_REQUIRE_TOKEN is on and no token"}},
)
async def metrics(request: Request, runtime: RuntimeDep) -> Response:
    """Cluster names only to a viewer token (of its clusters); rendered in a worker
    thread, so a scrape never holds the event loop (issue 13)."""
    clusters = metrics_scope(request, runtime)
    m = runtime.metrics
    m.buffered.set(runtime.recorder.pending)
    m.store_degraded.set(1 if runtime.degraded() else 0)
    body = await run_in_threadpool(m.render, clusters)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
