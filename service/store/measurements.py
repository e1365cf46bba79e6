"""Evidence: benchmark reports and build-failure reports, and reading them back.

Turning rows into evidence is ``core.evidence``'s job (situations, observations);
this module only maps columns to its functions' arguments.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core.evidence import (
    Observation,
    Situation,
    dims_key,
    failure_observation,
    packages_key,
)
from mla_switchboard.core.schemas import MeasurementReport, SelectRequest
from mla_switchboard.service.store.base import aware, bump
from mla_switchboard.service.store.models import DecisionRow, FailureRow, MeasurementRow
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session


class MeasurementStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def has_report(self, report_id: str) -> bool:
        with Session(self.engine) as s:
            q = select(MeasurementRow.id).where(MeasurementRow.report_id == report_id).limit(1)
            return s.scalar(q) is not None

    def add_measurements(self, report: MeasurementReport, report_id: str) -> int:
        cap = report.device.capability
        m = report.model
        now = datetime.now(UTC)
        rows = [
            MeasurementRow(
                report_id=report_id,
                at=now,
                cluster=report.cluster,
                node=report.node,
                pod=report.pod,
                device_name=report.device.name or "",
                capability=None if cap is None else f"{cap[0]}.{cap[1]}",
                dims=dims_key(m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
                num_heads=m.num_heads,
                dtype=report.dtype.value,
                packages=packages_key(report.packages),
                backend=r.backend.value,
                impl=r.impl,
                shape=r.shape.model_dump_json(),
                median_ms=r.median_ms,
                tflops=r.tflops,
                correct=r.correct and r.error is None,
                error=r.error,
            )
            for r in report.results
        ]
        with Session(self.engine) as s, s.begin():
            s.add_all(rows)
            bump(s, "evidence_version")
        return len(rows)

    def record_failure(self, decision_id: str, backend: str, error: str) -> None:
        with Session(self.engine) as s, s.begin():
            s.add(
                FailureRow(
                    at=datetime.now(UTC), decision_id=decision_id, backend=backend, error=error
                )
            )
            bump(s, "evidence_version")  # a build failure is evidence too

    def failures_for(self, decision_id: str) -> list[dict[str, Any]]:
        with Session(self.engine) as s:
            return [
                {"at": aware(f.at).isoformat(), "backend": f.backend, "error": f.error}
                for f in s.scalars(
                    select(FailureRow)
                    .where(FailureRow.decision_id == decision_id)
                    .order_by(FailureRow.id)
                )
            ]

    def evidence(self, since: datetime) -> list[Observation]:
        """Measured results since ``since``, plus build failures pods reported on
        decisions made since then (keyed by the situation of the failing pod)."""
        out: list[Observation] = []
        with self.engine.connect() as conn:
            q = select(
                MeasurementRow.device_name,
                MeasurementRow.capability,
                MeasurementRow.dims,
                MeasurementRow.dtype,
                MeasurementRow.packages,
                MeasurementRow.backend,
                MeasurementRow.pod,
                MeasurementRow.tflops,
                MeasurementRow.correct,
            ).where(MeasurementRow.at >= since, MeasurementRow.capability.is_not(None))
            for device, cap, dims, dtype, pkgs, backend, pod, tflops, ok in conn.execute(q):
                situation = Situation(device, cap, dims, dtype, pkgs)
                out.append(Observation(situation, backend, pod, tflops, ok=bool(ok)))
            failures = (
                select(
                    FailureRow.backend,
                    FailureRow.error,
                    FailureRow.at,
                    DecisionRow.request,
                    DecisionRow.pod,
                )
                .join(DecisionRow, DecisionRow.id == FailureRow.decision_id)
                .where(FailureRow.at >= since)
            )
            for backend, error, at, request_json, pod in conn.execute(failures):
                try:
                    request = SelectRequest.model_validate_json(request_json)
                except ValueError:
                    continue
                observation = failure_observation(request, backend, error, aware(at), pod)
                if observation is not None:
                    out.append(observation)
        return out
