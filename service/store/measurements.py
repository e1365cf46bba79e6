"""Evidence: benchmark reports and build-failure reports, and reading them back.

Turning rows into evidence is ``core.evidence``'s job (situations, observations);
this module only maps columns to its functions' arguments.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core.evidence import (
    Observation,
    Situation,
    dims_key,
    engine_key,
    failure_observation,
    measurement_source,
    packages_key,
    situation_of,
)
from mla_switchboard.core.schemas import MeasurementReport, SelectRequest
from mla_switchboard.service.shapes import request_from_shape
from mla_switchboard.service.store.audit import add_audit
from mla_switchboard.service.store.base import aware, bump
from mla_switchboard.service.store.models import DecisionRow, FailureRow, MeasurementRow, ShapeRow
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session


class MeasurementStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def has_report(self, report_id: str) -> bool:
        with Session(self.engine) as s:
            q = select(MeasurementRow.id).where(MeasurementRow.report_id == report_id).limit(1)
            return s.scalar(q) is not None

    def has_decision_for(self, cluster: str, pod: str, situation: Situation) -> bool:
        """Whether ``pod`` of ``cluster`` has a recorded decision for ``situation``:
        what makes its benchmark report count as evidence (issue 13). The pod's newest
        decisions are compared (a pod that changed packages has a newer one)."""
        q = (
            select(DecisionRow.request, ShapeRow.request, DecisionRow.node)
            .outerjoin(ShapeRow, ShapeRow.id == DecisionRow.shape_id)
            .where(DecisionRow.cluster == cluster, DecisionRow.pod == pod)
            .order_by(DecisionRow.id.desc())
            .limit(20)
        )
        with self.engine.connect() as conn:
            for request_json, shape_json, node in conn.execute(q):
                request = _request(request_json, shape_json, cluster, node, pod)
                if request is None:
                    continue
                if situation_of(request) == situation:
                    return True
        return False

    def add_measurements(
        self, report: MeasurementReport, report_id: str, *, counted: bool = True
    ) -> int:
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
                engine=engine_key(report.engine),
                counted=counted,
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
        decisions made since then (keyed by the situation of the failing pod); what an
        admin cleared is left out."""
        out: list[Observation] = []
        m = MeasurementRow
        with self.engine.connect() as conn:
            q = select(
                m.device_name, m.capability, m.dims, m.dtype, m.packages, m.engine,
                m.backend, m.pod, m.cluster, m.at, m.tflops, m.correct, m.error, m.impl,
                m.report_id,
            ).where(m.at >= since, m.capability.is_not(None), m.cleared_at.is_(None))  # fmt: skip
            # only reports from pods the service decided for count (issue 13)
            q = q.where(m.counted.is_(True)).order_by(m.id)
            index: dict[str, int] = {}  # a result's place in its report: its source
            for row in conn.execute(q):
                device, cap, dims, dtype, pkgs, engine, backend, pod, cluster, at = row[:10]
                tflops, ok, error, impl, report_id = row[10:]
                index[report_id] = index.get(report_id, -1) + 1
                out.append(
                    Observation(
                        Situation(device, cap, dims, dtype, pkgs, engine),
                        backend,
                        pod,
                        tflops,
                        ok=bool(ok),
                        cluster=cluster,
                        at=aware(at),
                        error=error if error is not None else (None if ok else "wrong result"),
                        impl=impl,
                        source=measurement_source(report_id, index[report_id]),
                    )
                )
            failures = conn.execute(self._failures(since))
            for (
                backend,
                error,
                at,
                request_json,
                shape_json,
                cluster,
                node,
                pod,
                decision_id,
            ) in failures:
                request = _request(request_json, shape_json, cluster, node, pod)
                if request is None:
                    continue  # recorded under an older schema
                observation = failure_observation(
                    request, backend, error, aware(at), pod, decision_id
                )
                if observation is not None:
                    out.append(observation)
        return out

    @staticmethod
    def _failures(since: datetime) -> Any:
        return (
            select(
                FailureRow.backend,
                FailureRow.error,
                FailureRow.at,
                DecisionRow.request,
                ShapeRow.request,
                DecisionRow.cluster,
                DecisionRow.node,
                DecisionRow.pod,
                FailureRow.decision_id,
            )
            .join(DecisionRow, DecisionRow.id == FailureRow.decision_id)
            .outerjoin(ShapeRow, ShapeRow.id == DecisionRow.shape_id)
            .where(FailureRow.at >= since, FailureRow.cleared_at.is_(None))
        )

    def clear_failures(
        self, situation: Situation, backend: str | None, *, actor: str, note: str
    ) -> int:
        """Mark a situation's failures (wrong results and failed builds, one backend or
        all) cleared, audited; measured selection stops counting them. Returns how many."""
        now = datetime.now(UTC)
        with Session(self.engine) as s, s.begin():
            m = MeasurementRow
            wrong = [
                m.correct.is_(False),
                m.cleared_at.is_(None),
                m.device_name == situation.device,
                m.capability == situation.capability,
                m.dims == situation.dims,
                m.dtype == situation.dtype,
                m.packages == situation.packages,
                m.engine == situation.engine,
            ]
            if backend is not None:
                wrong.append(m.backend == backend)
            cleared = s.execute(update(m).where(*wrong).values(cleared_at=now)).rowcount or 0
            ids = []
            q = (
                select(
                    FailureRow.id,
                    FailureRow.backend,
                    DecisionRow.request,
                    ShapeRow.request,
                    DecisionRow.cluster,
                    DecisionRow.node,
                    DecisionRow.pod,
                )
                .join(DecisionRow, DecisionRow.id == FailureRow.decision_id)
                .outerjoin(ShapeRow, ShapeRow.id == DecisionRow.shape_id)
            )
            for fid, fbackend, request_json, shape_json, cluster, node, pod in s.execute(
                q.where(FailureRow.cleared_at.is_(None))
            ):
                if backend is not None and fbackend != backend:
                    continue
                request = _request(request_json, shape_json, cluster, node, pod)
                if request is not None and situation_of(request) == situation:
                    ids.append(fid)
            if ids:
                s.execute(update(FailureRow).where(FailureRow.id.in_(ids)).values(cleared_at=now))
            cleared += len(ids)
            add_audit(
                s,
                actor=actor,
                action="evidence.clear_failures",
                target=situation.device,
                before=None,
                after={"situation": asdict(situation), "backend": backend, "cleared": cleared},
                note=note,
                preview=None,
            )
            bump(s, "evidence_version")
        return cleared


def _request(
    request_json: str | None,
    shape_json: str | None,
    cluster: str,
    node: str | None,
    pod: str | None,
) -> SelectRequest | None:
    """A decision's request, from its own text (older rows) or its shape; None when it
    no longer validates (recorded under an older schema)."""
    try:
        if request_json is not None:
            return SelectRequest.model_validate_json(request_json)
        if shape_json is None:
            return None
        return SelectRequest.model_validate(request_from_shape(shape_json, cluster, node, pod))
    except ValueError:
        return None
