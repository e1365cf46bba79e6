"""``POST /v1/select``: the call every serving pod makes at boot."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Iterable
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from mla_switchboard.core.evaluator import Refusal
from mla_switchboard.core.schemas import (
    NO_NUL,
    BackendName,
    Candidate,
    SelectRequest,
    SelectResponse,
    error_responses,
)
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.api.deps import (
    AgentDep,
    ReportsDep,
    act_as,
    get_decider,
    get_refused,
    get_workload,
    principal_from,
    verify_workload,
)
from mla_switchboard.service.api.outcomes import respond
from mla_switchboard.service.deciding import Decider
from mla_switchboard.service.identity.auth import Principal, asker_of
from mla_switchboard.service.reads import scope
from mla_switchboard.service.selector import Rendered
from mla_switchboard.service.state import UNKNOWN_ASKER, Asker
from pydantic import BaseModel, Field, StringConstraints, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException
from starlette.routing import request_response


def json_media_errors(content_type: str) -> list[dict[str, Any]] | None:
    """The 422 problem of a body whose ``Content-Type`` is not JSON, else None (FastAPI's
    own routes do not read such a body as JSON either)."""
    media = content_type.partition(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    problem: dict[str, Any] = {"type": "content_type", "loc": ("body",), "input": media or None}
    problem["msg"] = "expected Content-Type: application/json"
    return [problem]


M = TypeVar("M", bound=BaseModel)


def parse_json_body(model: type[M], raw: bytes) -> M:
    """``raw`` validated as ``model`` by pydantic's own JSON parser; raises
    ``RequestValidationError`` shaped as FastAPI's (``loc`` starts with ``"body"``)."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for e in errors:
            e["loc"] = ("body", *e["loc"])
            if e.get("type") == "json_invalid":
                # The input of a JSON syntax error is the raw body: bytes, maybe not
                # UTF-8, and not worth echoing; ``msg`` already says what and where.
                e.pop("ctx", None)
                e.pop("input", None)
        raise RequestValidationError(errors, body=raw) from None


class LeanJSONRoute(APIRoute):
    """An APIRoute whose handler validates the JSON body with pydantic directly.

    FastAPI's generic handler (dependency solving, body-to-args, response model) costs
    several times what ``/v1/select`` itself does; this keeps the same model, the same
    OpenAPI schema and the same 422 error shape (``loc`` starts with ``"body"``) at a
    fraction of the cost. The endpoint must take exactly ``(body: <Model>, request:
    Request)`` and return a finished ``Response``. It has no dependencies, so it runs
    under Starlette's ``request_response``: FastAPI's adds two exit stacks per request
    for dependencies with ``yield``, and there are none to close.
    """

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        self.app = request_response(self.get_route_handler())

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        model: type[BaseModel] = self.endpoint.__annotations__["body"]
        if isinstance(model, str):
            model = SelectRequest  # annotations are strings under postponed evaluation
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            errors = json_media_errors(request.headers.get("content-type", ""))
            if errors is not None:
                raise RequestValidationError(errors)
            body = parse_json_body(model, await request.body())
            return await endpoint(body, request)

        return handler


class PrebuiltResponse(Response):
    """An answer whose status, headers and body are ready as they are sent: nothing
    rendered or added (``Response.__init__`` would compute headers only to have them
    replaced)."""

    def __init__(self, status: int, headers: Headers, content: bytes) -> None:
        self.status_code = status
        self.raw_headers = headers
        self.body = content
        self.background = None


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
            },
            {
                "name": "dry_run",
                "in": "query",
                "required": False,
                "schema": {"type": "boolean", "default": False},
                "description": "decide and answer, record nothing (decision_id null): "
                "what switchboard select's dry runs send",
            },
        ],
    },
)
async def select(body: SelectRequest, request: Request) -> Response:
    """The route as FastAPI serves it: documented in the OpenAPI schema, and the
    reference the lean handler in front of the app (service/api/select_asgi.py) is
    tested against. Both answer through :func:`select_answer`."""
    dry_run = dry_run_of(request.scope["query_string"])
    workload = await get_workload(request)
    try:
        await verify_workload(request.headers.get("authorization", ""), workload)
        principal = principal_from(request, "agent")
        body = act_as(principal, body, workload, dry_run)
    except HTTPException as exc:
        (await get_refused(request)).count(body.cluster, exc)
        raise
    decider = await get_decider(request)
    if_none_match = request.headers.get("if-none-match")
    return PrebuiltResponse(
        *select_answer(decider, body, if_none_match, dry_run, asker_of(principal), principal)
    )


Headers = list[tuple[bytes, bytes]]
JSON_TYPE = (b"content-type", b"application/json")


def dry_run_of(query_string: bytes) -> bool:
    """The ``dry_run`` query parameter (false when absent), read as FastAPI reads a
    boolean; anything else raises ``RequestValidationError`` naming it."""
    if not query_string:
        return False
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    values = [v for k, v in pairs if k == "dry_run"]
    if not values:
        return False
    try:
        return _BOOL.validate_python(values[0])
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for e in errors:
            e["loc"] = ("query", "dry_run")
        raise RequestValidationError(errors) from None


_BOOL: TypeAdapter[bool] = TypeAdapter(bool)


def select_answer(
    decider: Decider,
    body: SelectRequest,
    if_none_match: str | None,
    dry_run: bool = False,
    asker: Asker = UNKNOWN_ASKER,
    principal: Principal | None = None,
) -> tuple[int, Headers, bytes]:
    """The status, headers and body to send for an authorised request: a dry run's
    answer has no ``decision_id`` (null) and no ``X-Decision-Id``.

    Plain bytes, so that the lean handler sends them as they are and the FastAPI
    route wraps them, with the same headers in the same order."""
    result, decision_id = decider.decide(body, dry_run, asker)
    if isinstance(result, Refusal):
        content = refusal_json(result)
        if principal is not None and _quotes_failures(result.candidates, principal):
            content = _scoped(principal, content, "detail")
        return 409, [(b"content-length", str(len(content)).encode()), JSON_TYPE], content
    if principal is not None and _quotes_failures(result.decision.candidates, principal):
        return _scoped_answer(result, decision_id, if_none_match, principal)
    matched = if_none_match is not None and result.etag in {
        t.strip() for t in if_none_match.split(",")
    }
    if decision_id is None:
        if matched:
            return 304, [(b"etag", result.etag_header)], b""
        content = result.dry_body
        return (
            200,
            [(b"etag", result.etag_header), (b"content-length", str(len(content)).encode()),
             JSON_TYPE],
            content,
        )  # fmt: skip
    id_header = decision_id.encode()
    if matched:
        return 304, [(b"etag", result.etag_header), (b"x-decision-id", id_header)], b""
    content = result.body(id_header)
    return (
        200,
        [
            (b"etag", result.etag_header),
            (b"x-decision-id", id_header),
            (b"content-length", str(len(content)).encode()),
            JSON_TYPE,
        ],
        content,
    )


def _quotes_failures(candidates: Iterable[Candidate], principal: Principal) -> bool:
    """Whether an answer quotes failing pods the caller may have to be spared: a
    restricted caller's answer with a backend excluded by failures."""
    return principal.restricted and any(c.exclusion is not None for c in candidates)


def _scoped(principal: Principal, content: bytes, inside: str | None = None) -> bytes:
    """An answer (or the ``inside`` part of it) in the words ``principal`` may read
    (``reads/scope.decision_answer``): what its cluster trusts may quote other
    clusters' failing pods and errors."""
    answer = json.loads(content)
    if inside is None:
        answer = scope.decision_answer(principal, answer)
    else:
        answer[inside] = scope.decision_answer(principal, answer[inside])
    return json.dumps(answer, separators=(",", ":")).encode()


def _scoped_answer(
    result: Rendered, decision_id: str | None, if_none_match: str | None, principal: Principal
) -> tuple[int, Headers, bytes]:
    """:func:`select_answer`'s answer for a restricted caller whose answer quotes
    failures: redacted, with an ETag of its own (never the unrestricted one's)."""
    etag = scope.etag(principal, result.etag)
    ids = [] if decision_id is None else [(b"x-decision-id", decision_id.encode())]
    if if_none_match is not None and etag in {t.strip() for t in if_none_match.split(",")}:
        return 304, [(b"etag", etag.encode()), *ids], b""
    raw = result.dry_body if decision_id is None else result.body(decision_id.encode())
    content = _scoped(principal, raw)
    length = (b"content-length", str(len(content)).encode())
    return 200, [(b"etag", etag.encode()), *ids, length, JSON_TYPE], content


def refusal_json(refusal: Refusal) -> bytes:
    """The 409 body: the refusal's message, kind and every candidate's reasons."""
    detail = RefusalDetail(
        message=refusal.message, kind=refusal.kind, candidates=list(refusal.candidates)
    )
    return RefusalBody(detail=detail).model_dump_json().encode()


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
    decision_id: str, report: FailureReport, reports: ReportsDep, principal: AgentDep
) -> Response:
    """Evidence against the backend for pods in the same situation (under the failure
    policy), and what a rollout's failure guard counts (see service/reports.py)."""
    return respond(reports.failure(principal, decision_id, report.backend, report.error))


__all__ = ["Backend", "router"]
