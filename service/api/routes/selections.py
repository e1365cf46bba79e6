"""What the fleet runs: the decision log, per-pod latest decisions, and the summary."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from mla_switchboard.core.schemas import (
    CLUSTER_PATTERN,
    NO_NUL,
    BackendName,
    DeviceInfo,
    ModelInfo,
    error_responses,
)
from mla_switchboard.service.api.deps import SelectionsDep, ViewerDep, fail
from mla_switchboard.service.api.etags import etag_matches
from mla_switchboard.service.api.params import IfNoneMatch
from mla_switchboard.service.state import DecisionRecord
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

router = APIRouter(
    prefix="/v1/selections", tags=["selections"], responses=error_responses(401, 403, 503)
)


class SelectionEngine(BaseModel):
    """The serving engine a decision was made for, as its request named it."""

    name: str
    version: str | None = None


class SelectionItem(BaseModel):
    decision_id: str
    time: datetime
    cluster: str
    node: str | None
    pod: str | None
    device: DeviceInfo
    model: ModelInfo
    dtype: str
    engine: SelectionEngine | None = Field(
        description="the serving engine the pod named (name and version), as the pods "
        "table shows it; null: the pod named none and runs switchboard's own kernels"
    )
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
        "engine": request.get("engine"),  # the stored request holds it: no join, no migration
        "backend": r.backend,
        "source": r.source,
        "rules_revision": r.rules_revision,
    }


@router.get("", response_model=SelectionPage, summary="Recorded decisions, newest first")
def list_selections(
    selections: SelectionsDep,
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
    rows, next_cursor = selections.page(
        principal,
        cluster=cluster,
        backend=None if backend is None else backend.value,
        pod=pod,
        limit=limit,
        before=cursor,
    )
    return {"items": [_item(r) for r in rows], "next_cursor": next_cursor}


@router.get(
    "/summary",
    response_model=Summary,
    responses={304: {"description": "If-None-Match matched: nothing changed"}},
    summary="Pods per cluster and backend, counting each pod's latest decision",
)
async def summary(
    selections: SelectionsDep,
    principal: ViewerDep,
    if_none_match: IfNoneMatch = None,
) -> Response:
    """``regret`` estimates, per cluster, the prefill throughput lost by the current
    choices against the best measured valid backend; ``excluded`` lists, per cluster,
    the backends that failure evidence excludes under policy measured, with the reason
    (see service/fleet/regret.py); ``rollouts`` each staged override's progress (see
    service/rollouts.py). A token limited to some clusters sees those clusters only.
    Computed from the fleet's counts by group, kept until something it depends on
    changes; the ETag says so (a matching If-None-Match gets 304)."""
    answer = selections.kept_summary(principal)  # a polling dashboard: no worker thread
    if answer is None:
        answer = await run_in_threadpool(selections.summary, principal)
    if etag_matches(if_none_match, answer.etag):
        return Response(status_code=304, headers={"ETag": answer.etag})
    return Response(answer.content, media_type="application/json", headers={"ETag": answer.etag})


@router.get(
    "/{decision_id}",
    response_model=SelectionDetail,
    responses=error_responses(404),
    summary="One decision in full",
)
def get_selection(
    decision_id: str, selections: SelectionsDep, principal: ViewerDep
) -> dict[str, Any]:
    found = selections.decision(principal, decision_id)
    if found is None:
        fail(404, f"no decision {decision_id!r}")
    record, failures = found
    return {
        **_item(record),
        "request": record.request,
        "answer": record.answer,
        "failures": failures,
    }
