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
    responses={503: {"description": "no rules loaded yet, or the configuration is too old"}},
)
async def readyz(runtime: RuntimeDep) -> Response:
    """Ready while rules are in memory, even if the database blips: emptying the load
    balancer because the store is down would turn a degraded service into an outage.
    The store's state is reported in the body (and in metrics): its kind of error
    only, never a host, port or URL (this route is open without a token).

    ``config_age_s`` is how old the replica's view of the configuration is (seconds
    since the store last confirmed it). With ``SWITCHBOARD_MAX_CONFIG_STALENESS_S``
    set, a replica whose view is older than that is not ready: it may be honouring a
    revoked token or missing an override. Off by default (see docs/reliability.md)."""
    snap = runtime.live.snapshot
    degraded = runtime.degraded()
    age = runtime.config_age_s()
    stale = runtime.config_stale()
    ready = snap is not None and not stale
    body: dict[str, Any] = {
        "status": "ready" if ready else "not ready",
        "rules_revision": None if snap is None else snap.rules.revision,
        "config_version": None if snap is None else snap.version,
        "config_age_s": None if age is None else round(age, 3),
        "max_config_staleness_s": runtime.settings.max_config_staleness_s,
        "config_stale": stale,
        "store": "degraded" if degraded else "ok",
        "store_error": None if degraded is None else degraded.split(":", 1)[0],
        "decisions_buffered": runtime.recorder.pending,
        "decisions_buffered_bytes": runtime.recorder.buffered_bytes,
        **spill_state(runtime.recorder.spill_error),
    }
    return JSONResponse(body, status_code=200 if ready else 503)


def spill_state(error: str | None) -> dict[str, str | None]:
    """The spill file's state for ``/readyz``: ``ok``, ``off`` (not configured) or
    ``degraded`` with the reason (an OS error's kind and text, or ``full``), never a
    path: while it is degraded, a crash during a database outage loses decisions."""
    if error is None:
        return {"spill": "ok", "spill_error": None}
    if error.startswith("off"):
        return {"spill": "off", "spill_error": error}
    return {"spill": "degraded", "spill_error": error}


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={401: {"description": "SWITCHBOARD_METRICS_REQUIRE_TOKEN is on and no token"}},
)
async def metrics(request: Request, runtime: RuntimeDep) -> Response:
    """Cluster names only to a viewer token (of its clusters); rendered in a worker
    thread, so a scrape never holds the event loop."""
    clusters = metrics_scope(request, runtime)
    m = runtime.metrics
    recorder = runtime.recorder
    m.buffered.set(recorder.pending)
    m.buffered_bytes.set(recorder.buffered_bytes)
    m.spill_bytes.set(recorder.spill_bytes())
    m.spill_degraded.set(1 if spill_state(recorder.spill_error)["spill"] == "degraded" else 0)
    m.store_degraded.set(1 if runtime.degraded() else 0)
    body = await run_in_threadpool(m.render, clusters)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
