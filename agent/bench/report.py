"""Reporting a bench: the ``POST /v1/measurements`` body, its delivery, and what
people and scripts read (a table, a JSON document).

Each result carries the exact situation the service keys evidence by (device name,
capability, dims, dtype, kernel package versions), the serving ``engine`` and the
code path (``impl``) that really ran: the FLASH_ATTN of a vLLM pod is not the
FLASH_ATTN of a bare-torch pod, and evidence must not mix them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mla_switchboard.agent.bench.plan import BenchPlan
from mla_switchboard.agent.bench.run import BenchOutcome
from mla_switchboard.agent.notes import log
from mla_switchboard.agent.settings import BearerToken, token_source_problem
from mla_switchboard.core.schemas import MeasurementReport

__all__ = [
    "NOTHING_MEASURED",
    "NOT_REQUESTED",
    "ReportStatus",
    "build_report",
    "deliver",
    "format_table",
    "to_document",
]

NOTHING_MEASURED = "nothing was measured"
NOT_REQUESTED = "--no-report"


@dataclass(frozen=True)
class ReportStatus:
    """What became of the report: posted (where, under which id), or why not."""

    posted: bool
    error: str | None = None
    url: str | None = None
    measurement_id: str | None = None
    results: int | None = None

    @property
    def ok(self) -> bool:
        """Posted, or deliberately not (``--no-report``, nothing measured)."""
        return self.posted or self.error in (NOT_REQUESTED, NOTHING_MEASURED)

    def to_dict(self) -> dict[str, Any]:
        if self.posted:
            return {
                "posted": True,
                "url": self.url,
                "measurement_id": self.measurement_id,
                "results": self.results,
            }
        return {"posted": False, "error": self.error}


def build_report(plan: BenchPlan, outcome: BenchOutcome) -> MeasurementReport | None:
    """The ``POST /v1/measurements`` body, or None when nothing was measured."""
    if not outcome.results:
        return None
    request = plan.pod.request
    return MeasurementReport.model_validate(
        {
            # one id per run, so that a retried POST (answer lost) is stored once
            "report_id": uuid.uuid4().hex[:26],
            "cluster": request.cluster,
            "pod": request.pod or "unknown",
            "node": request.node,
            "device": {"name": plan.device_name, "capability": plan.capability},
            "model": request.model.model_dump(mode="json"),
            "dtype": request.dtype.value,
            "packages": dict(request.packages or {}),
            "engine": None if request.engine is None else request.engine.model_dump(mode="json"),
            "results": [r.to_wire() for r in outcome.results],
        }
    )


def _post(
    report: MeasurementReport, urls: Sequence[str], token: BearerToken, deadline_s: float
) -> ReportStatus:
    """POST the report; never raises."""
    from mla_switchboard.agent.client import (
        ServiceRefused,
        ServiceUnavailable,
        post_json,
    )

    try:
        posted = post_json(
            "/v1/measurements",
            report.model_dump(mode="json"),
            urls=urls,
            token=token,
            deadline_s=deadline_s,
        )
    except (ServiceRefused, ServiceUnavailable) as exc:
        last = getattr(exc, "attempts", None)
        detail = f" (last: {last[-1]})" if last else ""
        return ReportStatus(False, f"{exc}{detail}")
    body = posted.body if isinstance(posted.body, dict) else {}
    return ReportStatus(True, None, posted.url, body.get("measurement_id"), body.get("results"))


def deliver(
    plan: BenchPlan,
    outcome: BenchOutcome,
    *,
    no_report: bool,
    urls: Sequence[str],
    token: BearerToken,
    deadline_s: float,
) -> ReportStatus:
    """Build the report and post it unless told not to, with ``token`` (the agent
    token of the settings); what became of it (logged)."""
    if outcome.skipped:
        log.warning("bench: %d steps skipped (%s)", len(outcome.skipped), outcome.skipped[0].reason)
    try:
        report = build_report(plan, outcome)
    except ValueError as exc:  # pydantic's ValidationError: a bug; keep the table
        log.error("bench: the results do not make a valid report: %s", exc)
        return ReportStatus(False, f"invalid report: {exc}")
    if report is None:
        log.warning("bench: %s, so nothing is reported", NOTHING_MEASURED)
        return ReportStatus(False, NOTHING_MEASURED)
    if no_report:
        return ReportStatus(False, NOT_REQUESTED)
    unreadable = token_source_problem(token)
    if unreadable is not None:
        log.warning("bench: %s", unreadable)
    status = _post(report, urls, token, deadline_s)
    if status.posted:
        log.info(
            "bench: reported %d results as measurement %s to %s",
            len(report.results),
            status.measurement_id,
            status.url,
        )
    else:
        log.error("bench: could not report the results: %s", status.error)
    return status


def to_document(
    plan: BenchPlan, outcome: BenchOutcome, *, report: ReportStatus | Mapping[str, Any]
) -> dict[str, Any]:
    """The ``--format json`` document: the situation, every result, what was skipped,
    and what became of the report."""
    request = plan.pod.request
    return {
        "cluster": request.cluster,
        "pod": request.pod,
        "node": request.node,
        "device": {
            "name": plan.device_name,
            "capability": None if plan.capability is None else list(plan.capability),
            "torch_device": plan.device,
        },
        "model": request.model.model_dump(mode="json"),
        "dtype": request.dtype.value,
        "packages": dict(request.packages or {}),
        "engine": None if request.engine is None else request.engine.model_dump(mode="json"),
        "shapes": [s.label for s in plan.shapes],
        "layers": plan.layers,
        "budget_s": plan.budget_s,
        "elapsed_s": round(outcome.elapsed_s, 3),
        "interrupted": outcome.interrupted,
        "results": [{**r.to_wire(), "host_us": r.host_us} for r in outcome.results],
        "checks": {b: {**asdict(c), "cases": list(c.cases)} for b, c in outcome.checks.items()},
        "skipped": [asdict(s) for s in outcome.skipped],
        "unavailable": plan.unavailable,
        "notes": list(plan.notes),
        "report": report.to_dict() if isinstance(report, ReportStatus) else dict(report),
    }


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(plan: BenchPlan, outcome: BenchOutcome) -> str:
    """A fixed-width table for people: results, then skipped and unavailable backends."""
    rows: list[tuple[str, ...]] = [
        ("backend", "impl", "shape", "correct", "median ms", "TFLOP/s", "note")
    ]
    for r in outcome.results:
        rows.append(
            (
                r.backend.value,
                r.impl or "-",
                f"{r.shape.label} H{r.num_heads}",
                "yes" if r.correct else "NO",
                _cell(r.median_ms, 3),
                _cell(r.tflops, 1 if (r.tflops or 0) >= 1 else 4),
                (r.error or "")[:160],
            )
        )
    for s in outcome.skipped:
        rows.append((s.backend, "-", s.shape or "(check)", "skipped", "-", "-", s.reason))
    for backend, reasons in plan.unavailable.items():
        rows.append((backend, "-", "-", "invalid", "-", "-", "; ".join(reasons)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [
            c.rjust(w) if i in (4, 5) else c.ljust(w)
            for i, (c, w) in enumerate(zip(row[:-1], widths, strict=True))
        ]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines) + "\n"
