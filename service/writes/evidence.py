"""Evidence writes: clearing recorded kernel failures, fleet-wide per situation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mla_switchboard.core.evidence import Situation
from mla_switchboard.service.auth import Principal
from mla_switchboard.service.outcomes import Done, Outcome, Problem
from mla_switchboard.service.store.measurements import MeasurementStore
from mla_switchboard.service.writes.flow import (
    IdempotencyKey,
    WriteFlow,
    pending,
)
from sqlalchemy.exc import SQLAlchemyError


@dataclass(eq=False)
class EvidenceWrites:
    """``catch_up``: read every clear the store holds now (``EvidenceSync.catch_up``)."""

    measurements: MeasurementStore
    catch_up: Callable[[], object]
    flow: WriteFlow

    def clear_failures(
        self,
        principal: Principal,
        situation: Situation,
        backend: str | None,
        *,
        note: str,
        key: IdempotencyKey | None,
    ) -> Outcome:
        """Evidence is fleet-wide per situation, so only an unrestricted admin may clear
        it. Every replica forgets those failures in place when it reads the clear (this
        one before answering)."""
        if principal.restricted:
            return Problem(403, "only an unrestricted admin token may clear fleet-wide evidence")

        def respond(cleared: int) -> tuple[int, dict[str, Any]]:
            return 200, {"cleared": cleared, "situation": asdict(situation), "backend": backend}

        result, answered = self.flow.attempt(
            principal,
            key,
            respond,
            lambda idem: self.measurements.clear_failures(
                situation, backend, actor=principal.actor, note=note, idempotency=idem
            ),
        )
        if answered is not None:
            return answered
        _, body = respond(result)
        try:
            self.catch_up()  # this replica at once, as the others will
        except SQLAlchemyError as exc:
            return Done({**body, **pending(exc)})
        return Done(body)
