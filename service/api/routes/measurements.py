"""``/v1/measurements``: the fleet's own kernel benchmarks (measured selection)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Response
from mla_switchboard.core.evidence import observations_of_report
from mla_switchboard.core.schemas import MeasurementReport, error_responses
from mla_switchboard.service.api.deps import AgentDep, RuntimeDep, ViewerDep, check_scope
from mla_switchboard.service.ids import new_id

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
    report_id = body.report_id or new_id()
    if body.report_id is not None and runtime.store.has_report(report_id):
        # the agent retried a report whose answer it never got: already stored
        response.status_code = 200
        return {"measurement_id": report_id, "results": len(body.results), "duplicate": True}
    count = runtime.store.add_measurements(body, report_id)
    # this replica at once; every replica (this one too) rebuilds from the store
    # within the poll interval
    runtime.add_evidence(observations_of_report(body, datetime.now(UTC)))
    return {"measurement_id": report_id, "results": count, "duplicate": False}


@router.get("/summary", summary="Evidence per situation and backend")
def summary(runtime: RuntimeDep, _: ViewerDep) -> dict[str, Any]:
    """Groups are (device, capability, dims, dtype, kernel package versions, backend),
    over the evidence window (``SWITCHBOARD_MEASURED_MAX_AGE_DAYS``); ``failures``
    counts wrong results and build failures reported by matching pods."""
    return {
        "groups": runtime.inputs.evidence.summary(datetime.now(UTC)),
        "failure_policy": runtime.inputs.evidence.failure_policy.describe(),
        "min_samples": runtime.settings.measured_min_samples,
        "min_pods": runtime.settings.measured_min_pods,
    }
