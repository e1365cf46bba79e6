"""``POST /v1/select``: the call every serving pod makes at boot."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response
from pydantic import BaseModel, Field, StringConstraints

from kernels.specs import Backend
from service.api.deps import AgentDep, RuntimeDep, check_scope, fail
from service.decision.engine import Decision, Refusal
from service.ids import new_id
from service.schemas import BackendName, Candidate, SelectRequest, SelectResponse
from service.store.repo import DecisionRecord

router = APIRouter(prefix="/v1", tags=["select"])


class RefusalDetail(BaseModel):
    message: str
    kind: str
    candidates: list[Candidate]


class RefusalBody(BaseModel):
    detail: RefusalDetail


_ID_PLACEHOLDER = "@@DECISION_ID@@"
_rendered: dict[int, tuple[Decision, str, str]] = {}


def _render(decision: Decision, rules_revision: int) -> tuple[str, str]:
    """JSON template and ETag of a decision, computed once per cached decision."""
    key = id(decision)
    hit = _rendered.get(key)
    if hit is not None and hit[0] is decision:
        return hit[1], hit[2]
    body = decision.to_response(
        rules_revision=rules_revision, decision_id=_ID_PLACEHOLDER
    ).model_dump_json()
    etag = '"' + hashlib.blake2b(body.encode(), digest_size=12).hexdigest() + '"'
    if len(_rendered) > 8192:
        _rendered.clear()
    _rendered[key] = (decision, body, etag)
    return body, etag


@router.post(
    "/select",
    response_model=SelectResponse,
    responses={
        304: {"description": "If-None-Match matched: the cached answer still holds"},
        401: {"description": "missing or unknown token"},
        403: {"description": "token lacks the agent role or the cluster"},
        409: {"model": RefusalBody, "description": "strict request invalid / nothing valid"},
        413: {"description": "body over 64 KiB"},
    },
    summary="Choose the MLA prefill backend for a pod",
)
async def select(
    body: SelectRequest,
    runtime: RuntimeDep,
    principal: AgentDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    check_scope(principal, body.cluster)
    snap = runtime.snapshot
    result = runtime.selector.select(body, snap)
    if isinstance(result, Refusal):
        runtime.metrics.refusals.labels(result.kind).inc()
        return Response(
            status_code=409,
            media_type="application/json",
            content=RefusalBody(
                detail=RefusalDetail(
                    message=result.message, kind=result.kind, candidates=list(result.candidates)
                )
            ).model_dump_json(),
        )
    revision = snap.rules.revision or 0
    template, etag = _render(result, revision)
    decision_id = new_id()
    now = datetime.now(UTC)
    runtime.recorder.submit(
        DecisionRecord(
            id=decision_id,
            created_at=now,
            cluster=body.cluster,
            node=body.node,
            pod=body.pod,
            backend=result.backend.value,
            source=result.source,
            rules_revision=revision,
            request=body.model_dump(mode="json"),
            answer=_answer_summary(result, revision),
        )
    )
    runtime.metrics.decisions.labels(result.backend.value, result.source, body.cluster).inc()
    headers = {"ETag": etag, "X-Decision-Id": decision_id}
    if if_none_match is not None and etag in {t.strip() for t in if_none_match.split(",")}:
        return Response(status_code=304, headers=headers)
    return Response(
        content=template.replace(_ID_PLACEHOLDER, decision_id),
        media_type="application/json",
        headers=headers,
    )


_summaries: dict[int, tuple[Decision, dict[str, Any]]] = {}


def _answer_summary(decision: Decision, revision: int) -> dict[str, Any]:
    key = id(decision)
    hit = _summaries.get(key)
    if hit is not None and hit[0] is decision:
        return hit[1]
    value = decision.to_response(rules_revision=revision, decision_id=None).model_dump(
        mode="json", exclude={"decision_id"}
    )
    if len(_summaries) > 8192:
        _summaries.clear()
    _summaries[key] = (decision, value)
    return value


class FailureReport(BaseModel):
    model_config = {"extra": "forbid"}
    backend: BackendName
    error: Annotated[str, StringConstraints(min_length=1, max_length=8000)] = Field(
        description="what went wrong building or running the kernel"
    )


@router.post(
    "/selections/{decision_id}/failure",
    status_code=202,
    summary="Report that the chosen kernel failed to build or run on the pod",
    responses={404: {"description": "unknown decision"}},
)
def report_failure(
    decision_id: str, report: FailureReport, runtime: RuntimeDep, principal: AgentDep
) -> dict[str, Any]:
    runtime.recorder.flush()
    record = runtime.store.get_decision(decision_id)
    if record is None:
        fail(404, f"no decision {decision_id!r}")
    check_scope(principal, record.cluster)
    runtime.store.record_failure(decision_id, report.backend.value, report.error)
    return {"decision_id": decision_id, "backend": report.backend, "recorded": True}


__all__ = ["Backend", "router"]
