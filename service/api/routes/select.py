"""``POST /v1/select``: the call every serving pod makes at boot."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from mla_switchboard.core.evaluator import Refusal
from mla_switchboard.core.evidence import failure_observation
from mla_switchboard.core.schemas import (
    NO_NUL,
    BackendName,
    Candidate,
    SelectRequest,
    SelectResponse,
    error_responses,
)
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.api.deps import AgentDep, RuntimeDep, check_scope, fail, principal_from
from mla_switchboard.service.ids import new_id
from mla_switchboard.service.runtime import Runtime
from mla_switchboard.service.store.decisions import decision_row
from pydantic import BaseModel, Field, StringConstraints, ValidationError


class LeanJSONRoute(APIRoute):
    """An APIRoute whose handler validates the JSON body with pydantic directly.

    FastAPI's generic handler (dependency solving, body-to-args) costs several times
    what ``/v1/select`` itself does; this keeps the same model, the same OpenAPI
    schema and the same 422 error shape (``loc`` starts with ``"body"``) at a fraction
    of the cost. The endpoint must take exactly ``(body: <Model>, request: Request)``.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        model: type[BaseModel] = self.endpoint.__annotations__["body"]
        if isinstance(model, str):
            model = SelectRequest  # annotations are strings under postponed evaluation
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                # FastAPI's own routes do not read such a body as JSON either
                problem = {"type": "content_type", "loc": ("body",), "input": media or None}
                problem["msg"] = "expected Content-Type: application/json"
                raise RequestValidationError([problem])
            raw = await request.body()
            try:
                body = model.model_validate_json(raw)
            except ValidationError as exc:
                errors = exc.errors(include_url=False)
                for e in errors:
                    e["loc"] = ("body", *e["loc"])
                    if e.get("type") == "json_invalid":
                        # The input of a JSON syntax error is the raw body: bytes, maybe
                        # not UTF-8 (FastAPI's encoder raised on them: a 500), and not
                        # worth echoing; ``msg`` already says what and where.
                        e.pop("ctx", None)
                        e.pop("input", None)
                raise RequestValidationError(errors, body=raw) from None
            return await endpoint(body, request)

        return handler


router = APIRouter(prefix="/v1", tags=["select"])
lean_router = APIRouter(prefix="/v1", tags=["select"], route_class=LeanJSONRoute)


class RefusalDetail(BaseModel):
    message: str
    kind: str
    candidates: list[Candidate]


class RefusalBody(BaseModel):
    detail: RefusalDetail


@lean_router.post(
    "/select",
    response_model=SelectResponse,
    responses={
        304: {"description": "If-None-Match matched: the cached answer still holds"},
        409: {"model": RefusalBody, "description": "strict request invalid / nothing valid"},
        **error_responses(401, 403, 413),
    },
    summary="Choose the MLA prefill backend for a pod",
    openapi_extra={
        "security": [{"HTTPBearer": []}],
        "parameters": [
            {
                "name": "If-None-Match",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": "ETag of a cached answer: 304 when it still holds",
            }
        ],
    },
)
async def select(body: SelectRequest, request: Request) -> Response:
    # Only the body goes through FastAPI's dependency machinery: on this path the
    # machinery costs more than the work (see bench/select_load.py).
    runtime: Runtime = request.app.state.runtime
    principal = principal_from(request, "agent")
    check_scope(principal, body.cluster)
    if_none_match = request.headers.get("if-none-match")
    inputs = runtime.inputs
    result = runtime.selector.select(body, inputs)
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
    rendered, decision = result, result.decision
    decision_id = new_id()
    now = datetime.now(UTC)
    runtime.recorder.submit(
        decision_row(
            decision_id,
            now,
            body,
            decision.backend.value,
            decision.source,
            inputs.rules.revision or 0,
            rendered.shape,
            rendered.answer_id,
            rendered.answer_json,
        )
    )
    runtime.metrics.decisions.labels(decision.backend.value, decision.source, body.cluster).inc()
    headers = {"ETag": rendered.etag, "X-Decision-Id": decision_id}
    if if_none_match is not None and rendered.etag in {t.strip() for t in if_none_match.split(",")}:
        return Response(status_code=304, headers=headers)
    return Response(
        content=rendered.body(decision_id),
        media_type="application/json",
        headers=headers,
    )


class FailureReport(BaseModel):
    model_config = {"extra": "forbid"}
    backend: BackendName
    error: Annotated[str, StringConstraints(min_length=1, max_length=8000, pattern=NO_NUL)] = Field(
        description="what went wrong building or running the kernel"
    )


@router.post(
    "/selections/{decision_id}/failure",
    status_code=202,
    summary="Report that the chosen kernel failed to build or run on the pod",
    responses=error_responses(401, 403, 404, 413, 503),
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
    # a build failure is evidence against the backend for pods in the same situation
    # (under the failure policy; see core/evidence.py)
    observation = failure_observation(
        SelectRequest.model_validate_json(record.request_json),
        report.backend.value,
        report.error,
        datetime.now(UTC),
        record.pod,
        decision_id,
    )
    if observation is not None:
        runtime.add_evidence([observation])
    runtime.rollouts.on_failure(record, report.backend.value, report.error)
    return {"decision_id": decision_id, "backend": report.backend, "recorded": True}


__all__ = ["Backend", "router"]
