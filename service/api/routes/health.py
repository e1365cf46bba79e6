"""Probes and metrics: the only routes open without a token."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from mla_switchboard.service.api.deps import HealthDep, metrics_scope
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Rules are in memory: ready to answer /v1/select",
    responses={503: {"description": "no rules loaded yet, or the configuration is too old"}},
)
async def readyz(health: HealthDep) -> Response:
    """Ready while rules are in memory, even if the database blips: emptying the load
    balancer because the store is down would turn a degraded service into an outage.
    The store's state is reported in the body (and in metrics): its kind of error
    only, never a host, port or URL (this route is open without a token).

    ``config_age_s`` is how old the replica's view of the configuration is (seconds
    since the store last confirmed it). With ``SWITCHBOARD_MAX_CONFIG_STALENESS_S``
    set, a replica whose view is older than that is not ready: it may be honouring a
    revoked token or missing an override. Off by default (see docs/reliability.md)."""
    ready, body = health.readiness()
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={401: {"description": "SWITCHBOARD_METRICS_REQUIRE_TOKEN is on and no token"}},
)
async def metrics(request: Request, health: HealthDep) -> Response:
    """Cluster names only to a viewer token (of its clusters); rendered in a worker
    thread, so a scrape never holds the event loop."""
    clusters = metrics_scope(request)
    m = health.refresh_gauges()
    body = await run_in_threadpool(m.render, clusters)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
