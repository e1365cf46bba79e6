"""People's sessions: who signed in through the identity provider, what their groups
give them, and how a later request proves it is theirs.

A session is a random id (256 bits) in an HttpOnly cookie; the store keeps only its
SHA-256, with the person's subject and e-mail and the role and clusters the group
mapping gave at sign-in, so any replica accepts it and a copy of the table signs no
one in. It lasts ``SWITCHBOARD_SESSION_HOURS`` and ends at sign-out (the row is
deleted: every replica refuses it at once).

A cookie is sent by the browser on its own, so a write authenticated by one must also
carry the session's CSRF token in a header (:data:`CSRF_HEADER`): the console reads it
from ``GET /auth/session``, which another site's page cannot read, and a cross-site
form cannot set a header. The token is derived from the session id, so no replica has
to store it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from mla_switchboard.service.auth import Principal
from mla_switchboard.service.config import RoleMapping
from mla_switchboard.service.oidc import Person
from mla_switchboard.service.outcomes import Problem
from mla_switchboard.service.store.sessions import SessionStore

SESSION_COOKIE = "sb_session"
LOGIN_COOKIE = "sb_login"
CSRF_HEADER = "X-CSRF-Token"


@dataclass(frozen=True)
class Grant:
    """What a person's groups give: a role in some clusters (None: every cluster)."""

    role: str
    clusters: tuple[str, ...] | None
    group: str


def grant_for(groups: Sequence[str], mapping: Sequence[RoleMapping]) -> Grant | None:
    """The first mapping entry naming one of ``groups`` (None: no entry does)."""
    mine = set(groups)
    for entry in mapping:
        if entry.group in mine:
            every = "*" in entry.clusters
            return Grant(entry.role, None if every else tuple(entry.clusters), entry.group)
    return None


def session_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def csrf_token(session_id: str) -> str:
    """The header value a cookie-authenticated write must carry: readable only by a page
    of this origin (``GET /auth/session``), never the session id itself."""
    return hashlib.sha256(b"csrf:" + session_id.encode()).hexdigest()


def csrf_ok(session_id: str, presented: str) -> bool:
    return hmac.compare_digest(csrf_token(session_id).encode(), presented.encode())


class People:
    """Signs people in and out, and finds the principal of a session cookie."""

    def __init__(
        self,
        sessions: SessionStore,
        mapping: Sequence[RoleMapping],
        lifetime: timedelta,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.sessions = sessions
        self.mapping = tuple(mapping)
        self.lifetime = lifetime
        self.now = now

    def sign_in(self, person: Person) -> tuple[str, datetime] | Problem:
        """A new session for ``person`` (its id, and when it ends), or 403 when none of
        their groups is mapped to a role."""
        grant = grant_for(person.groups, self.mapping)
        if grant is None:
            who = person.email or person.subject
            return Problem(
                403,
                f"{who} is in no group that has access to the Switchboard console "
                f"(groups: {', '.join(person.groups) or 'none'}); ask its admins to map one",
            )
        session_id = secrets.token_urlsafe(32)
        now = self.now()
        expires = now + self.lifetime
        self.sessions.add_session(
            session_hash(session_id),
            subject=person.subject,
            email=person.email,
            role=grant.role,
            clusters=grant.clusters,
            created_at=now,
            expires_at=expires,
        )
        return session_id, expires

    def principal(self, session_id: str) -> Principal | None:
        """The person of a live session (None: unknown, signed out or expired)."""
        found = self.sessions.find_session(session_hash(session_id), self.now())
        if found is None:
            return None
        return Principal.of_person(
            found.subject,
            found.email,
            found.role,  # type: ignore[arg-type]
            found.clusters,
        )

    def sign_out(self, session_id: str) -> None:
        self.sessions.delete_session(session_hash(session_id))
