"""People's sessions: written at sign-in, read on each request a person makes, deleted
at sign-out or once expired. Rows are keyed by the hash of the session id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from mla_switchboard.service.store.base import aware
from mla_switchboard.service.store.models import PersonSessionRow
from sqlalchemy import Engine, delete
from sqlalchemy.orm import Session


@dataclass(frozen=True)
class PersonSession:
    """Who a session is, and until when it holds."""

    subject: str
    email: str | None
    role: str
    clusters: tuple[str, ...] | None  # None: every cluster
    expires_at: datetime


@dataclass(eq=False)
class SessionStore:
    engine: Engine

    def add_session(
        self,
        id_hash: str,
        *,
        subject: str,
        email: str | None,
        role: str,
        clusters: Sequence[str] | None,
        created_at: datetime,
        expires_at: datetime,
    ) -> None:
        """A new session; expired ones are deleted in the same transaction, so the
        table holds about as many rows as people signed in."""
        with Session(self.engine) as s, s.begin():
            s.execute(delete(PersonSessionRow).where(PersonSessionRow.expires_at <= created_at))
            s.add(
                PersonSessionRow(
                    id_hash=id_hash,
                    subject=subject,
                    email=email,
                    role=role,
                    clusters=None if clusters is None else list(clusters),
                    created_at=created_at,
                    expires_at=expires_at,
                )
            )

    def find_session(self, id_hash: str, now: datetime) -> PersonSession | None:
        """The session, if it exists and has not expired at ``now``."""
        with Session(self.engine) as s:
            row = s.get(PersonSessionRow, id_hash)
            if row is None or aware(row.expires_at) <= now:
                return None
            return PersonSession(
                subject=row.subject,
                email=row.email,
                role=row.role,
                clusters=None if row.clusters is None else tuple(row.clusters),
                expires_at=aware(row.expires_at),
            )

    def delete_session(self, id_hash: str) -> bool:
        """Sign-out: whether there was such a session."""
        with Session(self.engine) as s, s.begin():
            gone = s.execute(delete(PersonSessionRow).where(PersonSessionRow.id_hash == id_hash))
            return bool(gone.rowcount)  # type: ignore[attr-defined]
