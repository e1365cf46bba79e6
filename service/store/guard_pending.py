"""Rollout guard evaluations still to run, kept in the database so every replica sees
them: a step waits while one is left (service/rollouts.py)."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from mla_switchboard.service.store.base import aware
from mla_switchboard.service.store.models import GuardPendingRow
from mla_switchboard.service.store.rows import PendingGuard
from sqlalchemy import Engine, Insert, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite


class Note(NamedTuple):
    """An evaluation to note: its key, its kind and what it is run from."""

    key: str
    kind: str
    payload: str


def note_statement(engine: Engine, note: Note, at: datetime) -> Insert:
    """The insert of ``note`` (kept first when its key is noted already), for a store
    that writes it in the transaction of the report it is about."""
    insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
    stmt = insert(GuardPendingRow).values(
        key=note.key, kind=note.kind, payload=note.payload, created_at=at
    )
    return stmt.on_conflict_do_nothing(index_elements=["key"])


class GuardPendingStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add(self, key: str, kind: str, payload: str, at: datetime) -> None:
        """Note an evaluation to run; the same key again keeps the first (a retried
        report is one evaluation)."""
        with self.engine.begin() as conn:
            conn.execute(note_statement(self.engine, Note(key, kind, payload), at))

    def remove(self, key: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(GuardPendingRow).where(GuardPendingRow.key == key))

    def waiting(self, noted_before: datetime, limit: int = 100) -> list[PendingGuard]:
        """The oldest evaluations noted before ``noted_before``."""
        t = GuardPendingRow
        q = (
            select(t.key, t.kind, t.payload, t.created_at)
            .where(t.created_at < noted_before)
            .order_by(t.created_at)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [
                PendingGuard(k, kind, payload, aware(at))
                for k, kind, payload, at in conn.execute(q)
            ]

    def oldest(self) -> datetime | None:
        """When the oldest evaluation still noted was noted (None: none is)."""
        with self.engine.connect() as conn:
            found = conn.execute(select(func.min(GuardPendingRow.created_at))).scalar()
        return None if found is None else aware(found)

    def count(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(select(func.count()).select_from(GuardPendingRow)).scalar() or 0
            )
