"""People's sessions: who signed in through the identity provider, what their groups
give them, and how a later request proves it is theirs.

A session is a random id (256 bits) in an HttpOnly cookie; the store keeps only its
SHA-256, with the person's subject, e-mail and groups, so any replica accepts it and a
copy of the table signs no one in. It lasts ``SWITCHBOARD_SESSION_HOURS`` and ends at
sign-out or an admin's revocation (the row is deleted: every replica refuses it at
once).

Rights follow the provider: the group mapping is applied to the stored groups on every
request (a mapping change applies at the next one), and the groups are asked of the
provider again once they are ``SWITCHBOARD_OIDC_GROUPS_REFRESH_S`` old (refresh token,
then userinfo). Someone removed from a group loses what it gave within that interval;
a person the provider no longer vouches for is signed out; a provider that cannot be
reached leaves the groups held in force and is asked again a minute later.

A cookie is sent by the browser on its own, so a write authenticated by one must also
carry the session's CSRF token in a header (:data:`CSRF_HEADER`): the console reads it
from ``GET /auth/session``, which another site's page cannot read, and a cross-site
form cannot set a header. The token is derived from the session id, so no replica has
to store it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import anyio.to_thread
from mla_switchboard.service.config import RoleMapping
from mla_switchboard.service.identity.auth import Principal
from mla_switchboard.service.identity.oidc import Gone, Person, Refreshed, RelyingParty
from mla_switchboard.service.outcomes import Problem
from mla_switchboard.service.store.sessions import PersonSession, SessionStore, Tokens

log = logging.getLogger("switchboard.people")

RETRY_UNREACHABLE_S = 60.0
"""How soon a provider that could not be asked is asked again."""

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
    """Signs people in and out, finds the principal of a session cookie, keeps their
    groups current, and lists and revokes sessions for admins."""

    def __init__(
        self,
        sessions: SessionStore,
        mapping: Sequence[RoleMapping],
        lifetime: timedelta,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        refresh_every: timedelta = timedelta(minutes=15),
    ) -> None:
        self.sessions = sessions
        self.mapping = tuple(mapping)
        self.lifetime = lifetime
        self.now = now
        self.refresh_every = refresh_every
        self._refreshing: dict[str, asyncio.Lock] = {}

    def sign_in(self, person: Person) -> tuple[str, datetime] | Problem:
        """A new session for ``person`` (its id, and when it ends), or 403 when none of
        their groups is mapped to a role."""
        grant = grant_for(person.groups, self.mapping)
        if grant is None:
            return self._no_group(person.email or person.subject, person.groups)
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
            groups=person.groups,
            tokens=Tokens(person.refresh_token, person.access_token),
        )
        return session_id, expires

    def session(self, session_id: str) -> PersonSession | None:
        """The live session of a cookie (None: unknown, signed out, revoked, expired)."""
        return self.sessions.find_session(session_hash(session_id), self.now())

    def principal(self, session_id: str) -> Principal | None:
        """The person of a live session with the rights their stored groups give now
        (None: no session, or no group mapped any more)."""
        found = self.session(session_id)
        if found is None:
            return None
        got = self.principal_of(found)
        return None if isinstance(got, Problem) else got

    def principal_of(self, found: PersonSession) -> Principal | Problem:
        """The rights the group mapping gives the session's groups, applied now; 403
        when none of them is mapped any more. A session from before groups were kept
        keeps what the mapping gave at sign-in."""
        if found.groups is None:
            role, clusters = found.role, found.clusters
        else:
            grant = grant_for(found.groups, self.mapping)
            if grant is None:
                return self._no_group(found.email or found.subject, found.groups)
            role, clusters = grant.role, grant.clusters
        return Principal.of_person(
            found.subject,
            found.email,
            role,  # type: ignore[arg-type]
            clusters,
            session=found.id_hash,
        )

    async def current(self, found: PersonSession, rp: RelyingParty | None) -> PersonSession | None:
        """``found`` with groups no older than the refresh interval: asked of the
        provider when due (one request per session at a time on this replica); None
        when the provider no longer vouches for the person (the session is ended)."""
        if rp is None or found.groups is None:
            return found
        due = found.checked_at is None or self.now() - found.checked_at >= self.refresh_every
        if not due:
            return found
        lock = self._refreshing.setdefault(found.id_hash, asyncio.Lock())
        try:
            async with lock:
                latest = await anyio.to_thread.run_sync(
                    self.sessions.find_session, found.id_hash, self.now()
                )
                if latest is None or (
                    latest.checked_at is not None
                    and self.now() - latest.checked_at < self.refresh_every
                ):
                    return latest  # ended, or refreshed meanwhile
                return await self._refresh(latest, rp)
        finally:
            if not lock.locked():
                self._refreshing.pop(found.id_hash, None)

    async def _refresh(self, found: PersonSession, rp: RelyingParty) -> PersonSession | None:
        answer = await rp.refresh_groups(found.subject, found.refresh_token, found.access_token)
        now = self.now()
        if isinstance(answer, Refreshed):
            tokens = Tokens(answer.refresh_token, answer.access_token)
            await anyio.to_thread.run_sync(
                self.sessions.refreshed, found.id_hash, answer.groups, tokens, now
            )
            return replace(found, groups=answer.groups, checked_at=now)
        if isinstance(answer, Gone):
            log.warning("signed %s out: %s", found.email or found.subject, answer.reason)
            await anyio.to_thread.run_sync(self.sessions.delete_session, found.id_hash)
            return None
        log.warning(
            "could not refresh the groups of %s (%s); the groups held stand",
            found.email or found.subject,
            answer.reason,
        )
        retry_at = now - self.refresh_every + timedelta(seconds=RETRY_UNREACHABLE_S)
        await anyio.to_thread.run_sync(self.sessions.postpone_check, found.id_hash, retry_at)
        return found

    def sign_out(self, session_id: str) -> None:
        self.sessions.delete_session(session_hash(session_id))

    def list_sessions(self) -> list[dict[str, object]]:
        """Every live session as an admin reads it: who, what the groups give now, and
        the first 12 hex digits of its id's hash (what revoking names); never a token."""
        out: list[dict[str, object]] = []
        for found in self.sessions.sessions(self.now()):
            got = self.principal_of(found)
            out.append(
                {
                    "id": found.id_hash[:12],
                    "subject": found.subject,
                    "email": found.email,
                    "groups": None if found.groups is None else list(found.groups),
                    "role": None if isinstance(got, Problem) else got.role,
                    "clusters": None
                    if isinstance(got, Problem) or got.clusters is None
                    else list(got.clusters),
                    "created_at": found.created_at.isoformat(),
                    "expires_at": found.expires_at.isoformat(),
                    "groups_checked_at": None
                    if found.checked_at is None
                    else found.checked_at.isoformat(),
                }
            )
        return out

    def revoke(self, *, session: str | None = None, subject: str | None = None) -> int:
        """End a session (by the id the list shows, at least 12 hex digits) or every
        session of a subject; how many ended."""
        if session is not None:
            return self.sessions.delete_sessions(prefix=session)
        return self.sessions.delete_sessions(subject=subject)

    @staticmethod
    def _no_group(who: str, groups: Sequence[str]) -> Problem:
        return Problem(
            403,
            f"{who} is in no group that has access to the Switchboard console "
            f"(groups: {', '.join(groups) or 'none'}); ask its admins to map one",
        )
