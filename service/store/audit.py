"""The audit trail: written inside each admin write's transaction, listed newest first."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.service.store.base import aware, newest_first
from mla_switchboard.service.store.models import AuditRow
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session


def add_audit(
    s: Session,
    *,
    actor: str,
    action: str,
    target: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    note: str | None,
    preview: dict[str, Any] | None,
    cause: dict[str, Any] | None = None,
) -> None:
    """One entry, in the caller's transaction (it commits or rolls back with the write).
    ``cause``: what a rollout guard's entry is about, as data (``core/causes.py``)."""
    s.add(
        AuditRow(
            at=datetime.now(UTC),
            actor=actor,
            action=action,
            target=target,
            before=before,
            after=after,
            note=note,
            preview=preview,
            cause=cause,
        )
    )


@dataclass(eq=False)
class AuditStore:
    engine: Engine

    def list_audit(
        self,
        *,
        action: str | None,
        target: str | None,
        actor: str | None,
        limit: int,
        before_id: int | None,
    ) -> list[dict[str, Any]]:
        q = newest_first(
            select(AuditRow),
            AuditRow.id,
            limit=limit,
            before_id=before_id,
            equal=((AuditRow.action, action), (AuditRow.target, target), (AuditRow.actor, actor)),
        )
        with Session(self.engine) as s:
            return [
                {
                    "id": r.id,
                    "at": aware(r.at).isoformat(),
                    "actor": r.actor,
                    "action": r.action,
                    "target": r.target,
                    "before": r.before,
                    "after": r.after,
                    "note": r.note,
                    "preview": r.preview,
                    "cause": r.cause,
                }
                for r in s.scalars(q)
            ]
