"""``/v1/measurements``: the fleet's own kernel benchmarks (measured selection)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response
from mla_switchboard.core.evidence import Situation, dims_key, observations_of_report, packages_key
from mla_switchboard.core.hardware import peak_bf16_tflops
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
    RuntimeDep,
    ViewerDep,
    check_scope,
    invalid,
)
from mla_switchboard.service.api.etags import etag_matches
from mla_switchboard.service.api.outcomes import IdempotencyKeyHeader, respond
from mla_switchboard.service.ids import new_id
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
def report(
    body: MeasurementReport, runtime: RuntimeDep, principal: AgentDep, response: Response
) -> dict[str, Any]:
    check_scope(principal, body.cluster)
    peak, known = peak_bf16_tflops(body.device.name)
    for i, result in enumerate(body.results):
        if result.tflops is not None and result.tflops > peak:
            gpu = f"the {known}'s" if known else "an unknown GPU's generous"
            invalid(
                ("body", "results", i, "tflops"),
                f"{result.tflops:g} TFLOP/s is above {gpu} dense bf16 peak of {peak:g} "
                "TFLOP/s: not a measurement",
            )
    report_id = body.report_id or new_id()
    if body.report_id is not None and runtime.store.has_report(report_id):
        # the agent retried a report whose answer it never got: already stored (its
        # guard evaluation is run again: the first attempt's may never have run)
        response.status_code = 200
        guard = runtime.rollouts.measurements_retried(body, report_id)
        return {
            "measurement_id": report_id,
            "results": len(body.results),
            "duplicate": True,
            "guard": guard,
        }
    observations = observations_of_report(body, datetime.now(UTC), report_id)
    reason = None
    if observations:
        # Evidence only from a pod the service decided for, in this cluster, in this
        # situation: a token cannot invent pods (or GPUs) to outvote real ones.
        # The pod's decision may still be in memory: wait for the writer's next batch
        # (at most the flush interval) rather than wake it, so that reports streaming
        # in do not turn its batches into one transaction each.
        if runtime.recorder.pending:
            runtime.recorder.flush(wake=False)
        if not runtime.store.has_decision_for(body.cluster, body.pod, observations[0].situation):
            reason = (
                f"pod {body.pod!r} has no recorded decision in cluster {body.cluster!r} for "
                "this device, capability, dims, dtype, packages and engine: stored, not "
                "counted as evidence (call /v1/select as this pod first)"
            )
    count = runtime.store.add_measurements(body, report_id, counted=reason is None)
    guard = None
    if reason is None:
        # this replica at once; the others read the new rows from the store within
        # their poll interval (service/evidence/sync.py)
        runtime.add_evidence(observations)
        guard = runtime.rollouts.measurements_reported(body, report_id)
    return {
        "measurement_id": report_id,
        "results": count,
        "duplicate": False,
        "guard": guard,
        "counted": reason is None and bool(observations),
        "not_counted_reason": reason
        if reason is not None or observations
        else "no GPU capability in the report: nothing to compare",
    }


@router.get(
    "/summary",
    summary="Evidence per situation and backend",
    responses={304: {"description": "If-None-Match matched: no evidence changed"}},
)
def summary(
    runtime: RuntimeDep,
    _: ViewerDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Groups are (device, capability, dims, dtype, kernel package versions, backend),
    over the evidence window (``SWITCHBOARD_MEASURED_MAX_AGE_DAYS``); ``failures``
    counts wrong results and build failures reported by matching pods. Kept until
    evidence changes; the ETag says so (a matching If-None-Match gets 304)."""
    answer = runtime.reads.evidence_summary()
    if etag_matches(if_none_match, answer.etag):
        return Response(status_code=304, headers={"ETag": answer.etag})
    return Response(answer.content, media_type="application/json", headers={"ETag": answer.etag})


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
        "switchboard"
    )
    backend: BackendName | None = Field(default=None, description="null: every backend")
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
    runtime: RuntimeDep,
    principal: AdminDep,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """Evidence is fleet-wide per situation, so only an unrestricted admin may clear it.
    Measured selection stops counting the cleared failures on every replica within the
    poll interval (this one at once)."""
    situation = Situation(
        device=body.device,
        capability=body.capability,
        dims=dims_key(*body.dims),
        dtype=body.dtype.value,
        packages=packages_key(body.packages),
        engine=body.engine,
    )
    backend = None if body.backend is None else body.backend.value
    key = IdempotencyKey.of(idempotency_key, "POST failures/clear", body.model_dump(mode="json"))
    return respond(
        runtime.writes.clear_failures(principal, situation, backend, note=body.note, key=key)
    )
