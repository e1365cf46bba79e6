"""What the fleet runs: the decision log, per-pod latest decisions, and the summary."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response
from mla_switchboard.core.schemas import (
    CLUSTER_PATTERN,
    NO_NUL,
    BackendName,
    DeviceInfo,
    ModelInfo,
    error_responses,
)
from mla_switchboard.service.api.deps import RuntimeDep, ViewerDep, fail
from mla_switchboard.service.api.etags import etag_matches
from mla_switchboard.service.state import DecisionRecord
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

router = APIRouter(
    prefix="/v1/selections", tags=["selections"], responses=error_responses(401, 403, 503)
)


class SelectionItem(BaseModel):
    decision_id: str
    time: datetime
    cluster: str
    node: str | None
    pod: str | None
    device: DeviceInfo
    model: ModelInfo
    dtype: str
    backend: str
    source: str
    rules_revision: int


class SelectionPage(BaseModel):
    items: list[SelectionItem]
    next_cursor: str | None


class SelectionDetail(SelectionItem):
    request: dict[str, Any]
    answer: dict[str, Any]
    failures: list[dict[str, Any]]


class Summary(BaseModel):
    clusters: dict[str, dict[str, int]]
    regret: dict[str, dict[str, Any]]
    excluded: dict[str, dict[str, str]] = {}
    rollouts: list[dict[str, Any]] = []


def _item(r: DecisionRecord) -> dict[str, Any]:
    request = r.request  # parsed from its JSON text: once
    return {
        "decision_id": r.id,
        "time": r.created_at,
        "cluster": r.cluster,
        "node": r.node,
        "pod": r.pod,
        "device": request.get("device") or {},
        "model": request["model"],
        "dtype": request["dtype"],
        "backend": r.backend,
        "source": r.source,
        "rules_revision": r.rules_revision,
    }


# A token limited to some clusters pages through the log with the others filtered
# out; one request reads at most this many rows, then answers what it found with the
# cursor where it stopped (a short page, or an empty one, with a next_cursor).
SCAN_LIMIT = 10_000


@router.get("", response_model=SelectionPage, summary="Recorded decisions, newest first")
def list_selections(
    runtime: RuntimeDep,
    principal: ViewerDep,
    cluster: Annotated[str | None, Query(pattern=CLUSTER_PATTERN, max_length=63)] = None,
    backend: BackendName | None = None,
    pod: Annotated[str | None, Query(max_length=253, pattern=NO_NUL)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[
        str | None,
        Query(
            pattern=r"^[0-9a-f]{26}$",
            description="next_cursor of the previous page: the items older than it",
        ),
    ] = None,
) -> dict[str, Any]:
    # The cursor is the last item's decision id: every value the pattern admits is a
    # position in the time-ordered log (schemathesis: any schema-valid cursor works).
    if cluster is not None and not principal.may_see(cluster):
        return {"items": [], "next_cursor": None}
    runtime.recorder.flush()
    if cluster is not None or not principal.restricted:
        rows = runtime.store.decisions.list_decisions(
            cluster=cluster,
            backend=None if backend is None else backend.value,
            pod=pod,
            limit=limit + 1,
            before_id=cursor,
        )
        more = len(rows) > limit
        rows = rows[:limit]
        return {
            "items": [_item(r) for r in rows],
            "next_cursor": rows[-1].id if more else None,
        }
    found: list[DecisionRecord] = []
    scanned, before = 0, cursor
    while len(found) < limit and scanned < SCAN_LIMIT:
        batch = runtime.store.decisions.list_decisions(
            cluster=None,
            backend=None if backend is None else backend.value,
            pod=pod,
            limit=1000,
            before_id=before,
        )
        if not batch:
            return {"items": [_item(r) for r in found], "next_cursor": None}
        for r in batch:
            scanned += 1
            before = r.id
            if principal.may_see(r.cluster):
                found.append(r)
                if len(found) == limit:
                    break
        if len(batch) < 1000 and len(found) < limit:
            return {"items": [_item(r) for r in found], "next_cursor": None}
    return {"items": [_item(r) for r in found], "next_cursor": before}


@router.get(
    "/summary",
    response_model=Summary,
    responses={304: {"description": "If-None-Match matched: nothing changed"}},
    summary="Pods per cluster and backend, counting each pod's latest decision",
)
async def summary(
    runtime: RuntimeDep,
    principal: ViewerDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """``regret`` estimates, per cluster, the prefill throughput lost by the current
    choices against the best measured valid backend; ``excluded`` lists, per cluster,
    the backends that failure evidence excludes under policy measured, with the reason
    (see service/fleet/regret.py); ``rollouts`` each staged override's progress (see
    service/rollouts.py). A token limited to some clusters sees those clusters only.
    Computed from the fleet's counts by group, kept until something it depends on
    changes; the ETag says so (a matching If-None-Match gets 304)."""
    scope = principal.clusters if principal.restricted else None
    answer = runtime.reads.kept_summary(scope)  # a polling dashboard: no worker thread
    if answer is None:
        visible = principal.may_see if principal.restricted else None
        answer = await run_in_threadpool(runtime.reads.summary, scope, visible)
    if etag_matches(if_none_match, answer.etag):
        return Response(status_code=304, headers={"ETag": answer.etag})
    return Response(answer.content, media_type="application/json", headers={"ETag": answer.etag})


@router.get(
    "/{decision_id}",
    response_model=SelectionDetail,
    responses=error_responses(404),
    summary="One decision in full",
)
def get_selection(decision_id: str, runtime: RuntimeDep, principal: ViewerDep) -> dict[str, Any]:
    runtime.recorder.flush()
    record = runtime.store.decisions.get_decision(decision_id)
    if record is None or not principal.may_see(record.cluster):
        fail(404, f"no decision {decision_id!r}")
    return {
        **_item(record),
        "request": record.request,
        "answer": record.answer,
        "failures": runtime.store.measurements.failures_for(decision_id),
    }
