"""What the fleet runs: the decision log, per-pod latest decisions, and the summary."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel

from service.api.deps import RuntimeDep, ViewerDep, fail, invalid
from service.schemas import CLUSTER_PATTERN, BackendName, DeviceInfo, ModelInfo
from service.store.repo import DecisionRecord, decode_cursor, encode_cursor

router = APIRouter(prefix="/v1/selections", tags=["selections"])


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


def _item(r: DecisionRecord) -> dict[str, Any]:
    return {
        "decision_id": r.id,
        "time": r.created_at,
        "cluster": r.cluster,
        "node": r.node,
        "pod": r.pod,
        "device": r.request.get("device") or {},
        "model": r.request["model"],
        "dtype": r.request["dtype"],
        "backend": r.backend,
        "source": r.source,
        "rules_revision": r.rules_revision,
    }


@router.get("", response_model=SelectionPage, summary="Recorded decisions, newest first")
def list_selections(
    runtime: RuntimeDep,
    _: ViewerDep,
    cluster: Annotated[str | None, Query(pattern=CLUSTER_PATTERN)] = None,
    backend: BackendName | None = None,
    pod: Annotated[str | None, Query(max_length=253)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    before = None
    if cursor is not None:
        try:
            before = decode_cursor(cursor)
        except ValueError as exc:
            invalid(("query", "cursor"), str(exc))
    runtime.recorder.flush()
    rows = runtime.store.list_decisions(
        cluster=cluster,
        backend=None if backend is None else backend.value,
        pod=pod,
        limit=limit + 1,
        before_id=before,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "items": [_item(r) for r in rows],
        "next_cursor": encode_cursor(rows[-1].id) if more else None,
    }


@router.get(
    "/summary",
    response_model=Summary,
    summary="Pods per cluster and backend, counting each pod's latest decision",
)
def summary(runtime: RuntimeDep, _: ViewerDep) -> dict[str, Any]:
    runtime.recorder.flush()
    return {"clusters": runtime.store.summary()}


@router.get("/{decision_id}", response_model=SelectionDetail, summary="One decision in full")
def get_selection(decision_id: str, runtime: RuntimeDep, _: ViewerDep) -> dict[str, Any]:
    runtime.recorder.flush()
    record = runtime.store.get_decision(decision_id)
    if record is None:
        fail(404, f"no decision {decision_id!r}")
    return {
        **_item(record),
        "request": record.request,
        "answer": record.answer,
        "failures": runtime.store.failures_for(decision_id),
    }
