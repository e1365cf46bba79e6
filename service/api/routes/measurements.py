"""``/v1/measurements``: the fleet's own kernel benchmarks (measured selection)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Response
from mla_switchboard.core.engines import OWN_ENGINE
from mla_switchboard.core.evidence import Situation
from mla_switchboard.core.schemas import (
    NO_NUL,
    NONBLANK,
    BackendName,
    DtypeName,
    Integral,
    MeasurementReport,
    PackageMap,
    ShortText,
    error_responses,
)
from mla_switchboard.service.api.deps import (
    AdminDep,
    AgentDep,
    EvidenceWritesDep,
    ReportsDep,
    SelectionsDep,
    ViewerDep,
)
from mla_switchboard.service.api.etags import etag_matches
from mla_switchboard.service.api.outcomes import respond
from mla_switchboard.service.api.params import IdempotencyKeyHeader, IfNoneMatch
from mla_switchboard.service.writes import IdempotencyKey
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

router = APIRouter(
    prefix="/v1/measurements", tags=["measurements"], responses=error_responses(401, 403)
)


@router.post(
    "",
    status_code=201,
    responses={
        200: {"description": "this report_id was stored before (a retry): nothing added"},
        **error_responses(413, 503),
    },
    summary="Report a pod's kernel benchmark results",
)
async def report(body: MeasurementReport, reports: ReportsDep, principal: AgentDep) -> Response:
    """Results count as evidence only from a pod the service decided for, in its cluster
    and exact situation (see service/reports.py); others are stored with the reason.
    Async: the report waits for the report writer's batch on the event loop, not on a
    worker thread of its own."""
    return respond(await reports.measurements(principal, body))


@router.get(
    "/summary",
    summary="Evidence per situation and backend",
    responses={304: {"description": "If-None-Match matched: no evidence changed"}},
)
def summary(
    reads: SelectionsDep,
    principal: ViewerDep,
    if_none_match: IfNoneMatch = None,
) -> Response:
    """Groups are (device, capability, dims, dtype, kernel package versions, backend),
    over the evidence window (``SWITCHBOARD_MEASURED_MAX_AGE_DAYS``); ``failures``
    counts wrong results and build failures reported by matching pods; a token limited
    to some clusters reads the failing pods of other clusters counted, not named. Kept
    until evidence changes; the ETag says so (a matching If-None-Match gets 304)."""
    answer = reads.evidence_summary(principal)
    if etag_matches(if_none_match, answer.etag):
        return Response(status_code=304, headers={"ETag": answer.etag})
    return Response(answer.content, media_type="application/json", headers={"ETag": answer.etag})


MAX_ROW_ID = 2**53 - 1
"""The largest row id a browser's JSON numbers carry exactly (and one JSON Schema's
``maximum`` states without rounding)."""


class SeenThroughIds(BaseModel):
    """The newest failure report ids the caller was shown: ``seen_through`` of
    ``GET /v1/measurements/summary``."""

    model_config = ConfigDict(extra="forbid")

    measurement_id: Annotated[int, Field(ge=0, le=MAX_ROW_ID, strict=True), Integral]
    failure_id: Annotated[int, Field(ge=0, le=MAX_ROW_ID, strict=True), Integral]


class FailureClear(BaseModel):
    """One situation, as ``GET /v1/measurements/summary`` lists it, whose failures an
    admin declares fixed (a new driver, a patched kernel)."""

    model_config = ConfigDict(extra="forbid")

    device: ShortText
    capability: Annotated[str, StringConstraints(pattern=r"^[0-9]{1,2}\.[0-9]{1,2}$")]
    dims: Annotated[
        list[Annotated[int, Field(ge=0, le=1024, strict=True), Integral]],
        Field(min_length=3, max_length=3),
    ]
    dtype: DtypeName
    packages: PackageMap = Field(default_factory=dict)
    engine: Annotated[str, StringConstraints(min_length=1, max_length=80, pattern=NO_NUL)] = (
        OWN_ENGINE
    )
    backend: BackendName | None = Field(default=None, description="null: every backend")
    seen_through: SeenThroughIds | None = Field(
        default=None,
        description="the summary's seen_through: only the failures reported up to it are "
        "cleared (one reported after you looked stays); null: every failure now stored",
    )
    note: Annotated[
        str,
        StringConstraints(strip_whitespace=True, min_length=1, max_length=2000, pattern=NONBLANK),
    ]


@router.post(
    "/failures/clear",
    summary="Clear a situation's failure evidence (audited)",
    responses=error_responses(413, 503),
)
def clear_failures(
    body: FailureClear,
    writes: EvidenceWritesDep,
    principal: AdminDep,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """Evidence is fleet-wide per situation, so only an unrestricted admin may clear it.
    Measured selection stops counting the cleared failures on every replica within the
    poll interval (this one at once)."""
    situation = Situation.of(
        device=body.device,
        capability=body.capability,
        dims=body.dims,
        dtype=body.dtype.value,
        packages=body.packages,
        engine=body.engine,
    )
    backend = None if body.backend is None else body.backend.value
    key = IdempotencyKey.of(idempotency_key, "POST failures/clear", body.model_dump(mode="json"))
    seen = None
    if body.seen_through is not None:
        seen = (body.seen_through.measurement_id, body.seen_through.failure_id)
    return respond(
        writes.clear_failures(
            principal, situation, backend, note=body.note, key=key, seen_through=seen
        )
    )
