"""Bearer tokens, roles and cluster scopes.

A token reads ``sb_<id>_<secret>``: the id finds the row, and the secret is checked
against its SHA-256 with ``hmac.compare_digest``, so the database never holds a usable
token and the comparison leaks nothing through timing.

A pod may instead present its Kubernetes service-account token (service/identity/workload.py);
its principal then carries the verified :class:`PodIdentity`, and :func:`identity_problem`
holds it to acting as itself, in its own cluster.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Literal

from mla_switchboard.core.names import cluster_matches
from mla_switchboard.service.identity.workload import PodIdentity
from mla_switchboard.service.outcomes import Problem
from mla_switchboard.service.state import Asker, TokenRecord

Role = Literal["agent", "viewer", "admin"]
ROLES: tuple[Role, ...] = ("agent", "viewer", "admin")


class OutOfScope(Exception):
    """A write reaches past the token's clusters (answered 403)."""


BOOTSTRAP_ID = "env:SWITCHBOARD_ADMIN_TOKEN"
"""The bootstrap admin token's id: stable across restarts and replicas, and unlike any
stored token's (12 hex digits), so nothing keyed by token id is shared with one."""


@dataclass(frozen=True)
class Principal:
    """Who a request's token is. ``name`` is what people read (audit actor, messages)
    and several tokens may share it; ``id`` tells tokens apart (what an
    ``Idempotency-Key`` is kept under: a replay must never hand one token the answer
    computed under another one's scope)."""

    name: str
    role: Role
    clusters: tuple[str, ...] | None  # None: every cluster
    id: str
    pod: PodIdentity | None = None  # a verified workload token's pod
    subject: str | None = None  # a signed-in person's subject at the identity provider
    session: str | None = None  # a signed-in person's session (its id's hash)

    @classmethod
    def of_person(
        cls,
        subject: str,
        email: str | None,
        role: Role,
        clusters: tuple[str, ...] | None,
        session: str | None = None,
    ) -> Principal:
        """A person signed in through the identity provider: named by their e-mail (what
        people read), told apart by their subject (e-mails get reassigned, subjects
        don't)."""
        digest = hashlib.sha256(subject.encode()).hexdigest()[:24]
        return cls(
            name=email or subject,
            role=role,
            clusters=clusters,
            id=f"person:{digest}",
            subject=subject,
            session=session,
        )

    @property
    def actor(self) -> str:
        """Who the audit says did it: a token's name, or a person's e-mail and subject
        (``alice@example.com (sub 2481...)``), within the audit's 100 characters."""
        if self.subject is None or self.name == self.subject:
            return self.name[:100]
        subject = self.subject
        if len(self.name) + len(subject) + 7 > 100:
            subject = "sha256:" + hashlib.sha256(subject.encode()).hexdigest()[:16]
        return f"{self.name[: 100 - len(subject) - 7]} (sub {subject})"

    @classmethod
    def of_pod(cls, identity: PodIdentity) -> Principal:
        """A verified pod: an agent limited to its issuer's clusters, named after the
        pod (what messages and logs read), told apart by the pod's UID."""
        return cls(
            name=f"pod {identity.namespace}/{identity.pod}",
            role="agent",
            clusters=identity.clusters,
            id=f"workload:{identity.pod_uid}",
            pod=identity,
        )

    def has(self, role: Role) -> bool:
        return self.role == role or self.role == "admin"

    def may_touch(self, cluster: str) -> bool:
        """Cluster scope; the fleet scope ``*`` only for unrestricted tokens."""
        if self.clusters is None:
            return True
        if cluster == "*":
            return False
        return cluster_matches(cluster, self.clusters)

    def out_of_scope(self, cluster: str) -> str:
        """Why this token may not write for ``cluster`` (the 403's message)."""
        scope = ", ".join(self.clusters or ())
        return f"token {self.name!r} is limited to clusters {scope}; not {cluster!r}"

    def may_see(self, cluster: str) -> bool:
        """Read scope: the token's clusters, and the fleet-wide ``*`` (fleet rules and
        the fleet override apply to its clusters too, and name no other cluster)."""
        return self.clusters is None or cluster == "*" or self.may_touch(cluster)

    @property
    def restricted(self) -> bool:
        return self.clusters is not None

    def covers(self, globs: tuple[str, ...] | None) -> bool:
        """Whether every cluster matched by ``globs`` (None: every cluster) is in this
        token's scope: what a scoped admin may list of other tokens. Sound, not
        complete: a glob is covered when it names one cluster in scope, equals one of
        ours, or its literal prefix extends the literal prefix of one of our ``P*``."""
        if self.clusters is None:
            return True
        if globs is None:
            return False
        return all(self._covers(glob) for glob in globs)

    def _covers(self, glob: str) -> bool:
        wild = next((i for i, ch in enumerate(glob) if ch in "*?["), None)
        if wild is None:
            return self.may_touch(glob)
        for mine in self.clusters or ():
            if glob == mine:
                return True
            stem = mine[:-1]
            if (
                mine.endswith("*")
                and not any(ch in stem for ch in "*?[")
                and (glob[:wild].startswith(stem))
            ):
                return True
        return False


def asker_of(principal: Principal) -> Asker:
    """What a decision records of who asked for it (``state.Asker``)."""
    return Asker(principal.id, principal.pod is not None)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token() -> tuple[str, str, str]:
    """(token id, full token shown once, hash of its secret to store)."""
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return token_id, f"sb_{token_id}_{secret}", hash_secret(secret)


def authenticate(
    presented: str, tokens: dict[str, TokenRecord], bootstrap: str | None
) -> Principal | None:
    if bootstrap is not None and hmac.compare_digest(presented.encode(), bootstrap.encode()):
        return Principal(name="bootstrap-admin", role="admin", clusters=None, id=BOOTSTRAP_ID)
    parts = presented.split("_", 2)
    if len(parts) != 3 or parts[0] != "sb":
        return None
    record = tokens.get(parts[1])
    if record is None or record.revoked:
        hmac.compare_digest(hash_secret(parts[2]), "0" * 64)  # same work either way
        return None
    if not hmac.compare_digest(hash_secret(parts[2]), record.secret_hash):
        return None
    return Principal(name=record.name, role=record.role, clusters=record.clusters, id=record.id)  # type: ignore[arg-type]


def identity_problem(
    principal: Principal, cluster: str, pod: str | None, requires_identity: bool
) -> Problem | None:
    """Whether ``principal`` may act as ``pod`` (None: no pod named) of ``cluster`` in an
    agent's call (select, measurements, failures); the refusal names the field at fault.

    A verified pod acts only as itself (the body's pod, when given, must be the token's)
    in its issuer's clusters. A static token may not act in a cluster that has an
    issuer (``requires_identity``): there every pod can prove who it is, and a shared
    secret, which proves nothing about the pod, would let one caller speak for many.
    """
    identity = principal.pod
    if identity is None:
        if requires_identity:
            return Problem(
                401,
                f"cluster {cluster!r} requires workload identity: present the pod's "
                "service-account token (SWITCHBOARD_TOKEN_FILE), not a static token",
            )
        return None
    if not cluster_matches(cluster, identity.clusters):
        scope = ", ".join(identity.clusters)
        return Problem(
            403,
            f"cluster: the service-account token of {principal.name} comes from an issuer "
            f"configured for clusters {scope}, not {cluster!r}. Give the agent the pod's "
            "own cluster (--cluster or SWITCHBOARD_CLUSTER), or, if this issuer does serve "
            f"{cluster!r}, add it to the issuer's clusters in SWITCHBOARD_WORKLOAD_ISSUERS",
            extra={"field": "cluster"},
        )
    if pod is not None and pod != identity.pod:
        return Problem(
            403,
            f"pod: the service-account token was issued to pod {identity.pod!r}, and a "
            f"pod reports only as itself, not as {pod!r}. Leave --pod and SWITCHBOARD_POD "
            "unset (the agent then takes the pod's name from its token), or set "
            "SWITCHBOARD_POD from the pod's metadata.name (the downward API)",
            extra={"field": "pod"},
        )
    return None
