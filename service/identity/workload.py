"""Workload identity: a pod proves who it is with its Kubernetes service-account token.

The kubelet mounts a projected token into the pod (``serviceAccountToken`` with the
audience configured here); it is a JWT signed by the cluster's service-account issuer
and names the pod in its ``kubernetes.io`` claims. Verifying it proves that the
bearer holds a token the cluster issued to that pod, for this service, not expired.
A static agent token proves only that the caller holds a secret every pod of the
cluster shares, so under workload identity the pod name comes from the token and
never from the body (docs/security.md, "What each credential proves").

Which issuer: the token's ``iss``, read before verification, must be a configured
issuer (``SWITCHBOARD_WORKLOAD_ISSUERS``); its keys, audience and clusters are then the
only ones the token is checked against. Signatures RS256 and ES256 only (never
``none`` or HS*: a shared secret is what this replaces), ``exp``/``nbf`` with
``leeway_s`` of clock skew (30 s by default), ``iss``, ``aud`` and ``exp`` required.

A verified token is kept by the SHA-256 of its text until it expires, so a pod's
repeated selects cost a hash and a dict lookup. The first sight of a token costs a
signature check (and maybe a key fetch), which :meth:`WorkloadVerifier.verify` does and
callers on the event loop run on a worker thread (:meth:`needs_verifying`).

Errors are values (:class:`Rejected`) with a reason fit to show the caller: which
check failed, never a key or the token.
"""

from __future__ import annotations

import fnmatch
import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jwt
from mla_switchboard.core.names import cluster_matches
from mla_switchboard.service.config import WorkloadIssuer
from mla_switchboard.service.identity.issuer_keys import IssuerKeys, KeyProblem

ALGORITHMS = ("RS256", "ES256")
CACHE_LIMIT = 100_000
"""Verified tokens kept at most (a fleet's pods, each with one or two live tokens)."""


@dataclass(frozen=True)
class PodIdentity:
    """Who a verified token says the caller is: a pod of one of ``clusters``."""

    issuer: str
    clusters: tuple[str, ...]
    namespace: str
    pod: str
    pod_uid: str
    service_account: str
    expires_at: float  # the token's exp, seconds since the epoch


@dataclass(frozen=True)
class Rejected:
    """Why a token is not accepted: answered ``status`` (401, or 503 when the issuer's
    keys could not be had) with ``reason``."""

    reason: str
    status: int = 401


def looks_like_jwt(token: str) -> bool:
    """Three dot-separated parts, as a JWS compact serialization is; static tokens
    (``sb_<id>_<secret>``) never contain a dot."""
    return token.count(".") == 2


class WorkloadVerifier:
    """Verifies workload tokens against the configured issuers and keeps the verified
    ones. ``keys_for``: builds an issuer's :class:`IssuerKeys` (tests pass their own
    refetch interval); ``clock``: seconds since the epoch."""

    def __init__(
        self,
        issuers: Sequence[WorkloadIssuer],
        *,
        leeway_s: float = 30.0,
        keys_for: Callable[[WorkloadIssuer], IssuerKeys] = IssuerKeys,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.issuers = {entry.issuer: entry for entry in issuers}
        self.leeway_s = leeway_s
        self._keys = {entry.issuer: keys_for(entry) for entry in issuers}
        self._clock = clock
        self._verified: dict[bytes, PodIdentity] = {}
        self._lock = threading.Lock()
        self._requires: dict[str, bool] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.issuers)

    def keys(self, issuer: str) -> IssuerKeys:
        return self._keys[issuer]

    def all_keys(self) -> dict[str, IssuerKeys]:
        """Every configured issuer's keys (their health: service/identity/key_health.py)."""
        return dict(self._keys)

    def requires_identity(self, cluster: str) -> bool:
        """Whether ``cluster`` has an issuer: its agents must present their pods' own
        tokens (a static agent token is refused there)."""
        if not self.issuers:
            return False
        known = self._requires.get(cluster)
        if known is None:
            known = any(cluster_matches(cluster, e.clusters) for e in self.issuers.values())
            if len(self._requires) < CACHE_LIMIT:
                self._requires[cluster] = known
        return known

    def cached(self, token: str) -> PodIdentity | None:
        """The identity of a token verified before and not yet expired, else None."""
        found = self._verified.get(_digest(token))
        if found is None or found.expires_at + self.leeway_s <= self._clock():
            return None
        return found

    def needs_verifying(self, token: str) -> bool:
        """Whether :meth:`verify` has work to do (a token not seen verified): a caller
        on the event loop runs it on a worker thread then."""
        return self.enabled and looks_like_jwt(token) and self.cached(token) is None

    def verify(self, token: str) -> PodIdentity | Rejected:
        """The token's pod identity, or why it is rejected."""
        found = self.cached(token)
        if found is not None:
            return found
        result = self._verify(token)
        if isinstance(result, PodIdentity):
            with self._lock:
                if len(self._verified) >= CACHE_LIMIT:
                    self._forget_expired()
                self._verified[_digest(token)] = result
        return result

    def _forget_expired(self) -> None:
        now = self._clock() - self.leeway_s
        live = {k: v for k, v in self._verified.items() if v.expires_at > now}
        if len(live) >= CACHE_LIMIT:
            live.clear()  # a flood of live tokens: start over rather than grow
        self._verified = live

    def _verify(self, token: str) -> PodIdentity | Rejected:
        try:
            header = jwt.get_unverified_header(token)
            peek = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return Rejected("malformed token")
        entry = self.issuers.get(peek.get("iss")) if isinstance(peek.get("iss"), str) else None
        if entry is None:
            return Rejected("unknown issuer")
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            return Rejected(f"unsupported algorithm (use one of {', '.join(ALGORITHMS)})")
        kid = header.get("kid")
        key = self._keys[entry.issuer].key(kid if isinstance(kid, str) else None)
        if isinstance(key, KeyProblem):
            return Rejected(key.reason, key.status)
        if key.algorithm_name != alg:
            return Rejected("algorithm does not match the issuer's key")
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=entry.audience,
                issuer=entry.issuer,
                leeway=self.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            return Rejected("token expired")
        except jwt.ImmatureSignatureError:
            return Rejected("token not yet valid (nbf)")
        except jwt.InvalidAudienceError:
            return Rejected("wrong audience")
        except jwt.InvalidIssuerError:
            return Rejected("unknown issuer")
        except jwt.InvalidSignatureError:
            return Rejected("bad signature")
        except jwt.MissingRequiredClaimError as exc:
            return Rejected(f"token lacks the {exc.claim} claim")
        except jwt.PyJWTError:
            return Rejected("malformed token")
        return _identity(entry, claims)


def _identity(entry: WorkloadIssuer, claims: dict[str, Any]) -> PodIdentity | Rejected:
    """The pod named by the ``kubernetes.io`` claims of a projected token (a token of a
    service account not bound to a pod, ``kubectl create token``, names none)."""
    k8s = claims.get("kubernetes.io")
    if not isinstance(k8s, dict):
        return Rejected("token lacks the kubernetes.io claims")
    pod = k8s.get("pod")
    account = k8s.get("serviceaccount")
    namespace = k8s.get("namespace")
    if not isinstance(pod, dict) or not _text(pod.get("name")) or not _text(pod.get("uid")):
        return Rejected("token is not bound to a pod (kubernetes.io.pod.name and .uid)")
    if not _text(namespace):
        return Rejected("token lacks kubernetes.io.namespace")
    if not isinstance(account, dict) or not _text(account.get("name")):
        return Rejected("token lacks kubernetes.io.serviceaccount.name")
    bound = f"{namespace}/{account['name']}"
    if entry.service_accounts is not None and not any(
        account_matches(namespace, account["name"], glob) for glob in entry.service_accounts
    ):
        return Rejected(
            f"service account {bound} may not act as an agent (the issuer's "
            f"service_accounts: {', '.join(entry.service_accounts)})",
            403,
        )
    return PodIdentity(
        issuer=entry.issuer,
        clusters=tuple(entry.clusters),
        namespace=namespace,
        pod=pod["name"],
        pod_uid=pod["uid"],
        service_account=account["name"],
        expires_at=float(claims["exp"]),
    )


def account_matches(namespace: str, name: str, glob: str) -> bool:
    """Whether the service account ``namespace/name`` is one ``glob`` (``ns-glob/
    name-glob``) names: each part matched on its own, so a ``*`` never spans the
    ``/`` (``prod*/agent`` is not ``prod/x/agent``)."""
    if "/" in namespace or "/" in name:
        return False
    namespace_glob, _, name_glob = glob.partition("/")
    return fnmatch.fnmatchcase(namespace, namespace_glob) and fnmatch.fnmatchcase(name, name_glob)


def _text(value: Any) -> bool:
    """A Kubernetes name as a token may carry it: never empty, never with a ``/``."""
    return isinstance(value, str) and 0 < len(value) <= 253 and "/" not in value


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
