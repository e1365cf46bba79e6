"""The audit trail: written inside each admin write's transaction, listed newest first."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.service.store.base import aware
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
) -> None:
    """One entry, in the caller's transaction (it commits or rolls back with the write)."""
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
        q = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
        if action is not None:
            q = q.where(AuditRow.action == action)
        if target is not None:
            q = q.where(AuditRow.target == target)
        if actor is not None:
            q = q.where(AuditRow.actor == actor)
        if before_id is not None:
            q = q.where(AuditRow.id < before_id)
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
                }
                for r in s.scalars(q)
            ]
