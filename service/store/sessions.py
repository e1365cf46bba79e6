"""People's sessions: written at sign-in, read on each request a person makes, their
groups refreshed from the provider now and then, deleted at sign-out, by an admin's
revocation, or once expired. Rows are keyed by the hash of the session id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from mla_switchboard.service.store.base import aware
from mla_switchboard.service.store.models import PersonSessionRow
from sqlalchemy import Engine, delete, select, update
from sqlalchemy.orm import Session


@dataclass(frozen=True)
class PersonSession:
    """Who a session is, what the provider last said of their groups, and until when
    it holds. ``groups`` None: a session from before groups were kept (its ``role`` and
    ``clusters``, mapped at sign-in, stand)."""

    id_hash: str
    subject: str
    email: str | None
    role: str
    clusters: tuple[str, ...] | None  # None: every cluster
    expires_at: datetime
    created_at: datetime
    groups: tuple[str, ...] | None = None
    checked_at: datetime | None = None
    refresh_token: str | None = None
    access_token: str | None = None


@dataclass(frozen=True)
class Tokens:
    """What the provider handed at sign-in or at the last refresh: how to ask it
    again for the person's groups."""

    refresh_token: str | None = None
    access_token: str | None = None


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
        groups: Sequence[str] | None = None,
        tokens: Tokens = Tokens(),
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
                    groups=None if groups is None else list(groups),
                    refresh_token=tokens.refresh_token,
                    access_token=tokens.access_token,
                    checked_at=created_at,
                )
            )

    def find_session(self, id_hash: str, now: datetime) -> PersonSession | None:
        """The session, if it exists and has not expired at ``now``."""
        with Session(self.engine) as s:
            row = s.get(PersonSessionRow, id_hash)
            if row is None or aware(row.expires_at) <= now:
                return None
            return _session(row)

    def sessions(self, now: datetime) -> list[PersonSession]:
        """Every live session, newest first (what an admin lists)."""
        with Session(self.engine) as s:
            rows = s.scalars(
                select(PersonSessionRow)
                .where(PersonSessionRow.expires_at > now)
                .order_by(PersonSessionRow.created_at.desc())
            )
            return [_session(row) for row in rows]

    def refreshed(
        self, id_hash: str, groups: Sequence[str], tokens: Tokens, checked_at: datetime
    ) -> None:
        """The provider's answer of ``checked_at``: the person's groups now, and the
        tokens to ask with next time (a provider that rotates refresh tokens)."""
        values: dict[str, object] = {"groups": list(groups), "checked_at": checked_at}
        if tokens.refresh_token is not None:
            values["refresh_token"] = tokens.refresh_token
        if tokens.access_token is not None:
            values["access_token"] = tokens.access_token
        with Session(self.engine) as s, s.begin():
            s.execute(
                update(PersonSessionRow).where(PersonSessionRow.id_hash == id_hash).values(**values)
            )

    def postpone_check(self, id_hash: str, checked_at: datetime) -> None:
        """The provider could not be asked: keep the groups held, ask again later."""
        with Session(self.engine) as s, s.begin():
            s.execute(
                update(PersonSessionRow)
                .where(PersonSessionRow.id_hash == id_hash)
                .values(checked_at=checked_at)
            )

    def delete_session(self, id_hash: str) -> bool:
        """Sign-out: whether there was such a session."""
        with Session(self.engine) as s, s.begin():
            gone = s.execute(delete(PersonSessionRow).where(PersonSessionRow.id_hash == id_hash))
            return bool(gone.rowcount)  # type: ignore[attr-defined]

    def delete_sessions(self, *, prefix: str | None = None, subject: str | None = None) -> int:
        """An admin's revocation: the sessions whose id hash starts with ``prefix`` (what
        the list shows of it) or every session of ``subject``; how many ended."""
        assert (prefix is None) != (subject is None), "one of prefix, subject"
        where = (
            PersonSessionRow.id_hash.startswith(prefix, autoescape=True)
            if prefix is not None
            else PersonSessionRow.subject == subject
        )
        with Session(self.engine) as s, s.begin():
            gone = s.execute(delete(PersonSessionRow).where(where))
            return int(gone.rowcount)  # type: ignore[attr-defined]


def _session(row: PersonSessionRow) -> PersonSession:
    return PersonSession(
        id_hash=row.id_hash,
        subject=row.subject,
        email=row.email,
        role=row.role,
        clusters=None if row.clusters is None else tuple(row.clusters),
        expires_at=aware(row.expires_at),
        created_at=aware(row.created_at),
        groups=None if row.groups is None else tuple(str(g) for g in row.groups),
        checked_at=None if row.checked_at is None else aware(row.checked_at),
        refresh_token=row.refresh_token,
        access_token=row.access_token,
    )
