"""What agents report: a pod's kernel benchmarks, and a kernel that failed on it.

Each report is one flow, run here so that the routes only parse, call and format:
who may report for which cluster, what counts as evidence (only a pod the service
decided for, in that pod's own situation: a token cannot invent pods or GPUs to
outvote real ones), the store write, the evidence this replica applies at once
(``EvidenceSync.apply_local``; other replicas read the store) and the rollout guards
(``service/rollouts.py``). Answers are values (``service/outcomes.py``); a report
that is stored is answered as stored, whatever its guard's fate (``"guard"``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
from mla_switchboard.core.evidence import Situation, failure_observation, observations_of_report
from mla_switchboard.core.hardware import peak_bf16_tflops
from mla_switchboard.core.schemas import MeasurementReport, SelectRequest
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.evidence.sync import EvidenceSync
from mla_switchboard.service.identity.auth import Principal, identity_problem
from mla_switchboard.service.ids import new_id
from mla_switchboard.service.outcomes import Done, Outcome, Problem
from mla_switchboard.service.rollouts import RolloutGuards
from mla_switchboard.service.store.decisions import DecisionStore
from mla_switchboard.service.store.measurements import (
    MeasurementStore,
    PendingReport,
    StoredReport,
)
from mla_switchboard.service.store.recorder import DecisionRecorder
from mla_switchboard.service.store.report_writes import ReportTicket, ReportWriter
from mla_switchboard.service.store.rows import Decision as Row
from mla_switchboard.service.store.shapes import shape_situation
from pydantic import ValidationError

REPORT_WAIT_S = 10.0
"""How long a report waits for its decision to be stored (its position to pass the
drainer's mark): a measurement report is then stored as not counted, a failure report
answered 404 (its decision is not in the database)."""


@dataclass(eq=False)
class Reports:
    """``evidence``: where this replica's own new evidence is applied at once (the
    ``writer``'s ``on_stored``, before a report is answered); ``writer``: where reports
    are stored, in groups (``store/report_writes.py``);
    ``requires_identity``: whether a cluster's agents must present their pods' own
    service-account tokens (service/identity/workload.py)."""

    measurement_store: MeasurementStore
    decisions: DecisionStore
    recorder: DecisionRecorder
    evidence: EvidenceSync
    rollouts: RolloutGuards
    writer: ReportWriter
    requires_identity: Callable[[str], bool] = lambda cluster: False
    deadline_s: float | None = None  # how long a report waits for its write (None: ever)

    async def measurements(self, principal: Principal, report: MeasurementReport) -> Outcome:
        """Store a pod's benchmark results (201), once per ``report_id`` (a retry: 200,
        nothing added); they count as evidence only from a pod with a recorded decision
        in its cluster for the report's exact situation, and are kept otherwise, with
        the reason they do not count. A verified pod reports only as itself.

        Run on the event loop: the checks here, the write on the report writer's
        thread, whose batch answers every report in it at once; no worker thread of its
        own. A report that must wait for its decision to be stored, or that a
        rollout's guard evaluates (a store read), goes on on a worker thread."""
        admitted = self._admit(principal, report)
        if not isinstance(admitted, PendingReport):
            return admitted
        if self._position(admitted) is not None or admitted.note is not None:
            return await anyio.to_thread.run_sync(self._stored_and_answered, admitted)
        ticket = self.writer.submit(admitted)
        if not ticket.done:
            await _done(ticket, self.deadline_s)
        stored = ticket.outcome()
        if stored is None:  # a retry: its guard is evaluated again (a store read)
            return await anyio.to_thread.run_sync(self._answer, admitted, stored)
        return self._answer(admitted, stored)

    def _stored_and_answered(self, admitted: PendingReport) -> Outcome:
        """The rest of ``measurements`` on a worker thread, for a report that waits."""
        position = self._position(admitted)
        if position is not None:
            self.recorder.wait_stored(position, REPORT_WAIT_S)
        return self._answer(admitted, self.writer.store(admitted, self.deadline_s))

    def _admit(self, principal: Principal, report: MeasurementReport) -> PendingReport | Problem:
        """The report as it is to be stored, or why it is refused."""
        problem = identity_problem(
            principal, report.cluster, report.pod, self.requires_identity(report.cluster)
        )
        if problem is not None:
            return problem
        if not principal.may_touch(report.cluster):
            return Problem(403, principal.out_of_scope(report.cluster))
        too_fast = _above_peak(report)
        if too_fast is not None:
            return too_fast
        report_id = report.report_id or new_id()
        observations = observations_of_report(report, datetime.now(UTC), report_id)
        situation = None
        decided = False
        if observations:
            situation = observations[0].situation
            # The pod's decision may not be stored yet: when it is in the log (and in
            # memory) it counts as it is; else the report waits for its own position
            # to pass the mark (``_position``), and the store looks it up.
            logged = self.recorder.logged_decision(report.cluster, report.pod)
            decided = logged is not None and _decided_for(logged, situation, principal.id)
        # a guard note is stored with the report only when some rollout's guard counts it
        note = self.rollouts.measurements_note(report, report_id)
        return PendingReport(
            report, report_id, situation, principal.id, note, decided, observations
        )

    def _position(self, admitted: PendingReport) -> int | None:
        """The position of the pod's decision to wait for before the store looks it up;
        None when there is nothing to wait for (no situation, decided from the log, or
        no decision of the pod waiting to be stored)."""
        if admitted.situation is None or admitted.decided:
            return None
        return self.recorder.position_of(admitted.report.cluster, admitted.report.pod)

    def _answer(self, admitted: PendingReport, stored: StoredReport | None) -> Outcome:
        """The answer to a report the writer stored (its evidence applied here already,
        ``ReportWriter.on_stored``), or found stored before (``stored`` None)."""
        report, report_id = admitted.report, admitted.report_id
        if stored is None:
            # the agent retried a report whose answer it never got: already stored (its
            # guard evaluation is run again: the first attempt's may never have run)
            guard = self.rollouts.measurements_retried(report, report_id)
            body = {"measurement_id": report_id, "results": len(report.results)}
            return Done({**body, "duplicate": True, "guard": guard}, status=200)
        reason = None
        if not stored.counted:
            reason = (
                f"pod {report.pod!r} has no decision recorded for this token in cluster "
                f"{report.cluster!r} for this device, capability, dims, dtype, packages "
                "and engine: stored, not counted as evidence (call /v1/select as this "
                "pod, with this token, first)"
            )
        guard = None
        if reason is None:
            guard = self.rollouts.measurements_reported(report, report_id, noted=stored.noted)
        body: dict[str, Any] = {
            "measurement_id": report_id,
            "results": stored.results,
            "duplicate": False,
            "guard": guard,
            "counted": reason is None and bool(admitted.observations),
            "not_counted_reason": reason
            if reason is not None or admitted.observations
            else "no GPU capability in the report: nothing to compare",
        }
        return Done(body, status=201)

    def failure(
        self, principal: Principal, decision_id: str, backend: Backend, error: str
    ) -> Outcome:
        """Record that the kernel a decision chose failed to build or run (202). It is
        evidence against ``backend`` for pods in the same situation, under the failure
        policy (``core/evidence/``), and what a rollout's failure guard counts. A
        verified pod reports only its own decisions' failures."""
        # the decision may not be stored yet: wait for its own position (at once when
        # it is stored already), not for every decision given before it
        position = self.recorder.position_of_decision(decision_id)
        if position is not None:
            self.recorder.wait_stored(position, REPORT_WAIT_S)
        record = self.decisions.get_decision(decision_id)
        if record is None and self.recorder.pending and self.recorder.flush():
            record = self.decisions.get_decision(decision_id)  # a leftover of the log
        if record is None:
            return Problem(
                404,
                f"no decision {decision_id!r} was recorded: an id this service never "
                "gave, or a decision it could not keep (its select answer said "
                "recorded: false and gave no id since)",
            )
        # a decision recorded under no pod is no verified pod's to report on
        owner = record.pod if record.pod is not None else "(no pod)"
        problem = identity_problem(
            principal, record.cluster, owner, self.requires_identity(record.cluster)
        )
        if problem is not None:
            return problem
        if not principal.may_touch(record.cluster):
            return Problem(403, principal.out_of_scope(record.cluster))
        if record.principal is not None and record.principal != principal.id:
            # what a guard counts is the decision's asker: another caller's report on it
            # would let one token speak for decisions it never asked for
            return Problem(
                403,
                f"decision_id: decision {decision_id!r} was asked for with another token; "
                "a token reports failures only of the decisions it asked for",
                extra={"field": "decision_id"},
            )
        request = _stored_request(record.request_json)
        now = datetime.now(UTC)  # stored and in memory alike (a clear forgets by it)
        noted = self.rollouts.expect_failure(record, backend.value, error)
        self.measurement_store.record_failure(decision_id, backend.value, error, now)
        observation = None
        if request is not None:
            observation = failure_observation(
                request, backend.value, error, now, record.pod, decision_id
            )
        if observation is not None:
            self.evidence.apply_local([observation])
        guard = self.rollouts.failure_reported(record, backend.value, error, noted=noted)
        body = {
            "decision_id": decision_id,
            "backend": backend.value,
            "recorded": True,
            "guard": guard,
        }
        return Done(body, status=202)


def _stored_request(request_json: str) -> SelectRequest | None:
    """The request a stored decision answered, or None when today's contract no longer
    reads it (a row written by an older release): the failure is still recorded and
    guarded, only not turned into evidence for a situation that cannot be read."""
    try:
        return SelectRequest.model_validate_json(request_json)
    except ValidationError:
        return None


def _above_peak(report: MeasurementReport) -> Problem | None:
    """A result faster than the GPU's dense bf16 peak is not a measurement (a forged
    or broken report): refused, naming the field."""
    peak, known = peak_bf16_tflops(report.device.name)
    for i, result in enumerate(report.results):
        if result.tflops is not None and result.tflops > peak:
            gpu = f"the {known}'s" if known else "an unknown GPU's generous"
            return Problem(
                422,
                f"{result.tflops:g} TFLOP/s is above {gpu} dense bf16 peak of {peak:g} "
                "TFLOP/s: not a measurement",
                field=("body", "results", i, "tflops"),
            )
    return None


def _decided_for(logged: Row, situation: Situation, asker: str) -> bool:
    """Whether a pod's decision in the log makes its report count: it is for the
    report's situation and was asked for by the same caller (or by no known one), as
    ``store_reports`` asks of stored decisions."""
    return logged.principal in (None, asker) and shape_situation(logged.shape_json) == situation


async def _done(ticket: ReportTicket, timeout_s: float | None) -> None:
    """Wait on the event loop until the writer is done with ``ticket``; past
    ``timeout_s`` the ticket is given up (``StoreTimeout``, saying what was stored)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    ticket.on_done(lambda: loop.call_soon_threadsafe(wake))
    try:
        await asyncio.wait_for(done, timeout_s)
    except TimeoutError:
        ticket.give_up(timeout_s or 0.0)
