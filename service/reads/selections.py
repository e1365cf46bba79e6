"""The decision log as a caller's token may read it, newest first, and one decision
in full; this replica's own decisions are written first (the caller sees the one it
was just given)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from mla_switchboard.service.fleet.reads import Answer, FleetReads
from mla_switchboard.service.identity.auth import Principal
from mla_switchboard.service.reads import scope
from mla_switchboard.service.state import DecisionRecord
from mla_switchboard.service.store.decisions import DecisionStore
from mla_switchboard.service.store.measurements import MeasurementStore
from mla_switchboard.service.store.recorder import DecisionRecorder

SCAN_LIMIT = 10_000
"""A token limited to some clusters pages through the log with the others filtered
out; one request reads at most this many rows, then answers what it found with the
cursor where it stopped (a short page, or an empty one, with a next_cursor)."""

SCAN_BATCH = 1000


@dataclass(eq=False)
class SelectionReads:
    recorder: DecisionRecorder
    decisions: DecisionStore
    measurements: MeasurementStore
    fleet_reads: FleetReads

    def page(
        self,
        principal: Principal,
        *,
        cluster: str | None,
        backend: str | None,
        pod: str | None,
        limit: int,
        before: str | None,
    ) -> tuple[list[DecisionRecord], str | None]:
        """Decisions older than ``before`` (a decision id), newest first, and the
        cursor of the next page (None: the last)."""
        if cluster is not None and not principal.may_see(cluster):
            return [], None
        self.recorder.settle_for_read()
        if cluster is not None or not principal.restricted:
            rows = self.decisions.list_decisions(
                cluster=cluster, backend=backend, pod=pod, limit=limit + 1, before_id=before
            )
            more = len(rows) > limit
            rows = rows[:limit]
            return rows, rows[-1].id if more else None
        found: list[DecisionRecord] = []
        scanned = 0
        while len(found) < limit and scanned < SCAN_LIMIT:
            batch = self.decisions.list_decisions(
                cluster=None, backend=backend, pod=pod, limit=SCAN_BATCH, before_id=before
            )
            if not batch:
                return found, None
            for r in batch:
                scanned += 1
                before = r.id
                if principal.may_see(r.cluster):
                    found.append(r)
                    if len(found) == limit:
                        break
            if len(batch) < SCAN_BATCH and len(found) < limit:
                return found, None
        return found, before

    def decision(
        self, principal: Principal, decision_id: str
    ) -> tuple[DecisionRecord, list[dict[str, Any]]] | None:
        """One decision and the failures reported of it; None when the caller may not
        see it (or there is none)."""
        self.recorder.settle_for_read()
        record = self.decisions.get_decision(decision_id)
        if record is None or not principal.may_see(record.cluster):
            return None
        if principal.restricted and record.answer_json is not None:
            answer = scope.decision_answer(principal, record.answer)
            record = replace(record, answer_json=json.dumps(answer))
        return record, self.measurements.failures_for(decision_id)

    def kept_summary(self, principal: Principal) -> Answer | None:
        """The fleet summary for this caller when it is kept and current (no I/O)."""
        return self.fleet_reads.kept_summary(_scope(principal))

    def summary(self, principal: Principal) -> Answer:
        """The fleet summary for this caller (see ``FleetReads.summary``)."""
        if not principal.restricted:
            return self.fleet_reads.summary(None, None)
        return self.fleet_reads.summary(
            _scope(principal), principal.may_see, partial(scope.summary, principal)
        )

    def evidence_summary(self, principal: Principal) -> Answer:
        """``/v1/measurements/summary`` for this caller: other clusters' failing pods
        counted, never named (``core/evidence.FailurePolicy``)."""
        if not principal.restricted:
            return self.fleet_reads.evidence_summary()
        return self.fleet_reads.evidence_summary(_scope(principal), principal.may_see)


def _scope(principal: Principal) -> tuple[str, ...] | None:
    return principal.clusters if principal.restricted else None
