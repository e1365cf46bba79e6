"""Evidence writes: clearing recorded kernel failures, fleet-wide per situation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mla_switchboard.core.evidence import Situation
from mla_switchboard.service.identity.auth import Principal
from mla_switchboard.service.outcomes import Done, Outcome, Problem
from mla_switchboard.service.store.measurements import Cleared, MeasurementStore, SeenThrough
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
        seen_through: tuple[int, int] | None = None,
    ) -> Outcome:
        """Evidence is fleet-wide per situation, so only an unrestricted admin may clear
        it. Every replica forgets those failures in place when it reads the clear (this
        one before answering). ``seen_through``: the newest failure rows (measurement
        id, failure id) the caller was shown (``seen_through`` of the evidence
        summary); later ones stay, and the answer says how many."""
        seen = None if seen_through is None else SeenThrough(*seen_through)
        if principal.restricted:
            return Problem(403, "only an unrestricted admin token may clear fleet-wide evidence")

        def respond(done: Cleared) -> tuple[int, dict[str, Any]]:
            body: dict[str, Any] = {
                "cleared": done.count,
                "newer_not_cleared": done.newer,
                "situation": asdict(situation),
                "backend": backend,
            }
            if done.newer:
                body["message"] = (
                    f"{done.newer} failure report(s) of this situation arrived after the ones "
                    "you saw and were not cleared; reload to see them before clearing again"
                )
            elif seen is not None and done.count == 0:
                body["message"] = "nothing left to clear: what you saw was cleared already"
            return 200, body

        result, answered = self.flow.attempt(
            principal,
            key,
            respond,
            lambda idem: self.measurements.clear_failures(
                situation, backend, actor=principal.actor, note=note, idempotency=idem, seen=seen
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
