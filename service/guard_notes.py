"""Guard evaluations noted in the database before their report is stored.

Every replica's rollout step waits while a note exists, so another replica that reaches
the database cannot promote past a halt this one could not write (it lost the database
between storing the report and running the guard). A replica removes its note once the
guard ran; one left past ``grace_s`` (its replica died, or lost the database for good)
is run by whichever replica checks next. A note is taken only for a report some guard
counts (``measurements_guarded``, ``failure_guarded``): in the stage of an active rollout
whose guards take the report's cluster. Every other report, however many rollouts are
active elsewhere, costs no extra write: its guard evaluation changes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from mla_switchboard.core.evaluator import (
    DecisionInputs,
    applicable_overrides,
    in_stage,
)
from mla_switchboard.core.evidence import situation_of
from mla_switchboard.core.names import cluster_matches
from mla_switchboard.core.schemas import MeasurementReport, SelectRequest
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.state import DecisionRecord
from mla_switchboard.service.store.base import OutcomeUnknown
from mla_switchboard.service.store.guard_pending import GuardPendingStore, Note
from mla_switchboard.service.store.rows import PendingGuard
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError

log = logging.getLogger("switchboard.rollouts")

STORE_ERRORS = (SQLAlchemyError, OutcomeUnknown)
"""What defers a report's guard evaluation: any database error."""
TRANSIENT_ERRORS = (OperationalError, InterfaceError, OutcomeUnknown)
"""What keeps a deferred evaluation waiting: the database is away or did not answer."""


class Unknown:
    """The database could not say which notes are outstanding: no step is taken."""


UNKNOWN = Unknown()


def measurements_guarded(report: MeasurementReport, inputs: DecisionInputs, now: datetime) -> bool:
    """Whether a measurement report feeds a speed guard: its pod is in the stage of an
    active rollout of an override that applies to it, whose guards take its cluster
    (what ``RolloutGuards.on_measurements`` evaluates). Only the fleet's and the
    cluster's own overrides are read, so the cost does not grow with other clusters'."""
    request = report_request(report)
    if situation_of(request) is None:
        return False
    for o in applicable_overrides(request, inputs.override_set, now):
        r = o.rollout
        if r is None or r.state != "active":
            continue
        if cluster_matches(request.cluster, r.guard_clusters) and in_stage(request, o):
            return True
    return False


def failure_guarded(record: DecisionRecord, backend: str) -> bool:
    """Whether a failure report feeds a failure guard: the backend failed is the one the
    decision gave, and its answer names a rollout that put the pod in its stage (what
    ``RolloutGuards.on_failure`` counts; the rollout's state is read there)."""
    return bool(staged_rollouts(record, backend))


def staged_rollouts(record: DecisionRecord, backend: str) -> set[tuple[str, str]]:
    """The (cluster, rollout id) of the rollouts whose stage the decision's answer put
    its pod in, with an effect; empty when ``backend`` is not the one it gave."""
    if record.answer_json is None or backend != record.backend:
        return set()
    refs = json.loads(record.answer_json).get("overrides") or []
    return {
        (r["cluster"], r["rollout"]["id"])
        for r in refs
        if r.get("rollout") and r["rollout"]["in_stage"] and r["effect"] != "none"
    }


def report_request(report: MeasurementReport) -> SelectRequest:
    """The select request a report's pod made, as far as a guard reads it."""
    return SelectRequest(
        cluster=report.cluster,
        pod=report.pod,
        node=report.node,
        device=report.device,
        model=report.model,
        dtype=report.dtype,
        packages=report.packages,
        engine=report.engine,
    )


def failure_key(decision_id: str, backend: str) -> str:
    return f"failure:{decision_id}:{backend}"


def measurements_key(report_id: str) -> str:
    return f"measurements:{report_id}"


def measurements_note(report: MeasurementReport, report_id: str) -> Note:
    """The note of a measurement report's evaluation (stored with the report itself:
    ``store_reports``, store/measurements.py)."""
    payload = json.dumps({"report_id": report_id, "report": report.model_dump(mode="json")})
    return Note(measurements_key(report_id), "measurements", payload)


@dataclass(eq=False)
class GuardNotes:
    """The notes of one database."""

    store: GuardPendingStore
    grace_s: float = 10.0

    def expect_failure(self, decision_id: str, backend: str, error: str) -> None:
        payload = json.dumps({"decision_id": decision_id, "backend": backend, "error": error})
        self._note(failure_key(decision_id, backend), "failure", payload)

    def _note(self, key: str, kind: str, payload: str) -> None:
        self.store.add(key, kind, payload, datetime.now(UTC))

    def done(self, key: str) -> None:
        self.store.remove(key)

    def run_left(
        self, run_of: Callable[[PendingGuard], Callable[[], None]]
    ) -> datetime | Unknown | None:
        """Run the notes their replica left for longer than ``grace_s`` (``run_of``: the
        evaluation a note stands for); then when the oldest note still outstanding was
        taken (None: none is; ``UNKNOWN``: the database could not say). A step waits
        only for notes taken before it came due: those are its stage's reports, and
        notes taken later (a steady stream of reports) never hold it back."""
        try:
            noted = self.store.waiting(datetime.now(UTC) - timedelta(seconds=self.grace_s))
            for item in noted:
                try:
                    run_of(item)()
                except TRANSIENT_ERRORS:
                    raise
                except Exception:
                    log.exception("noted rollout guard evaluation %s dropped", item.key)
                self.store.remove(item.key)
            if noted:
                log.warning("rollout guard evaluations left by a replica done: %d", len(noted))
            return self.store.oldest()
        except STORE_ERRORS as exc:
            log.warning("noted rollout guard evaluations not read or run: %s", first_line(exc))
            return UNKNOWN
