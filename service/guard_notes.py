"""Guard evaluations noted in the database before their report is stored.

Every replica's rollout step waits while a note exists, so another replica that reaches
the database cannot promote past a halt this one could not write (it lost the database
between storing the report and running the guard). A replica removes its note once the
guard ran; one left past ``grace_s`` (its replica died, or lost the database for good)
is run by whichever replica checks next. Notes are taken only while a rollout is active:
otherwise there is nothing to guard, and reports cost no extra write.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from mla_switchboard.core.schemas import MeasurementReport, Override
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.store.base import OutcomeUnknown
from mla_switchboard.service.store.guard_pending import GuardPendingStore
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


def rollouts_active(overrides: Iterable[Override]) -> bool:
    """Whether any of ``overrides`` has an active rollout (what notes are kept for)."""
    return any(o.rollout is not None and o.rollout.state == "active" for o in overrides)


def failure_key(decision_id: str, backend: str) -> str:
    return f"failure:{decision_id}:{backend}"


def measurements_key(report_id: str) -> str:
    return f"measurements:{report_id}"


@dataclass(eq=False)
class GuardNotes:
    """The notes of one database. ``active``: whether any rollout is active now."""

    store: GuardPendingStore
    active: Callable[[], bool]
    grace_s: float = 10.0

    def expect_failure(self, decision_id: str, backend: str, error: str) -> None:
        payload = json.dumps({"decision_id": decision_id, "backend": backend, "error": error})
        self._note(failure_key(decision_id, backend), "failure", payload)

    def expect_measurements(self, report: MeasurementReport, report_id: str) -> None:
        payload = json.dumps({"report_id": report_id, "report": report.model_dump(mode="json")})
        self._note(measurements_key(report_id), "measurements", payload)

    def _note(self, key: str, kind: str, payload: str) -> None:
        if self.active():
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
