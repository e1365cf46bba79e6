"""The OIDC relying party: a person signs in at the identity provider, and the
service learns who they are and which groups they are in.

Authorization code flow with PKCE (S256), ``state`` and ``nonce``: :meth:`start` makes
the provider's URL and the three secrets the browser keeps until the callback (in an
HttpOnly cookie: any replica can finish what another began); :meth:`finish` exchanges
the code and verifies the ID token's signature against the provider's published keys
(found through its discovery document, whose ``issuer`` must be the configured one),
its ``iss``, ``aud`` (this client), ``exp`` and ``nonce``. The grant URL and the token
request are built with Authlib's RFC 6749/7636 helpers; the JWT is checked with PyJWT,
the library that already verifies pods' service-account tokens (one JOSE library to
keep current, asymmetric algorithms only).

Errors are values (:class:`~mla_switchboard.service.outcomes.Problem`) fit to show the
person: which check failed, never a token or a key.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import jwt
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri, prepare_token_request
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from mla_switchboard.service.config import Settings
from mla_switchboard.service.identity.issuer_keys import IssuerKeys, KeyProblem
from mla_switchboard.service.outcomes import Problem

log = logging.getLogger("switchboard.oidc")

ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "PS256")
LEEWAY_S = 30.0
KEYS_MAX_AGE_S = 3600.0
REFETCH_S = 30.0


@dataclass(frozen=True)
class Pending:
    """What the browser holds between the redirect to the provider and the callback."""

    state: str
    nonce: str
    verifier: str


@dataclass(frozen=True)
class Person:
    """Who the provider says signed in, and the tokens it handed to ask again later
    (never shown, never logged)."""

    subject: str
    email: str | None
    groups: tuple[str, ...]
    refresh_token: str | None = field(default=None, repr=False)
    access_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Refreshed:
    """The provider's answer when asked again: the person's groups now."""

    groups: tuple[str, ...]
    refresh_token: str | None = field(default=None, repr=False)
    access_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Gone:
    """The provider no longer vouches for the person (tokens revoked, account gone):
    their session ends."""

    reason: str


@dataclass(frozen=True)
class Unreachable:
    """The provider could not be asked now; the groups held stand until the next try."""

    reason: str


class RelyingParty:
    """This service as an OIDC client of one provider (``SWITCHBOARD_OIDC_*``)."""

    def __init__(
        self,
        settings: Settings,
        client: Callable[[], httpx.AsyncClient] = lambda: httpx.AsyncClient(timeout=10.0),
    ) -> None:
        assert settings.oidc_issuer and settings.oidc_client_id and settings.oidc_redirect_url
        self.issuer = settings.oidc_issuer
        self.client_id = settings.oidc_client_id
        secret = settings.oidc_client_secret
        self.client_secret = secret.get_secret_value() if secret is not None else None
        self.redirect_url = settings.oidc_redirect_url
        self.scopes = settings.oidc_scopes
        self.groups_claim = settings.oidc_groups_claim
        self.provider_name = settings.oidc_provider_name
        self._client = client
        self._discovery: dict[str, Any] | None = None
        self._keys: IssuerKeys | None = None  # once discovery named the jwks_uri

    async def start(self) -> tuple[str, Pending] | Problem:
        """The provider's authorization URL, and what the callback must find again."""
        found = await self._discovered()
        if isinstance(found, Problem):
            return found
        pending = Pending(
            state=secrets.token_urlsafe(32),
            nonce=secrets.token_urlsafe(32),
            verifier=secrets.token_urlsafe(48),
        )
        url = prepare_grant_uri(
            found["authorization_endpoint"],
            self.client_id,
            "code",
            redirect_uri=self.redirect_url,
            scope=self.scopes,
            state=pending.state,
            nonce=pending.nonce,
            code_challenge=create_s256_code_challenge(pending.verifier),
            code_challenge_method="S256",
        )
        return url, pending

    async def finish(self, code: str, state: str, pending: Pending) -> Person | Problem:
        """The person behind the callback's ``code``, once ``state`` is the one this
        browser was sent with and the ID token checks out."""
        if not hmac.compare_digest(state.encode(), pending.state.encode()):
            return Problem(400, "state: the callback's state is not the one this sign-in sent")
        found = await self._discovered()
        if isinstance(found, Problem):
            return found
        body = prepare_token_request(
            "authorization_code",
            code=code,
            redirect_uri=self.redirect_url,
            code_verifier=pending.verifier,
            client_id=self.client_id,
        )
        auth = (self.client_id, self.client_secret) if self.client_secret else None
        try:
            async with self._client() as http:
                answer = await http.post(
                    found["token_endpoint"],
                    content=body,
                    auth=auth,  # type: ignore[arg-type]
                    headers={"Content-Type": "application/x-www-form-urlencoded"},
                )
        except httpx.HTTPError as exc:
            return Problem(502, f"the identity provider could not be reached: {type(exc).__name__}")
        if answer.status_code != 200:
            return _refused(answer)
        tokens = _json(answer)
        id_token = tokens.get("id_token")
        if not isinstance(id_token, str):
            return Problem(502, "the identity provider answered no id_token")
        person = await self.verify_id_token(id_token, pending.nonce)
        if isinstance(person, Problem):
            return person
        return Person(
            person.subject,
            person.email,
            person.groups,
            refresh_token=_text(tokens.get("refresh_token")),
            access_token=_text(tokens.get("access_token")),
        )

    async def refresh_groups(
        self, subject: str, refresh_token: str | None, access_token: str | None
    ) -> Refreshed | Gone | Unreachable:
        """Ask the provider again who ``subject`` is: a refresh-token grant for a fresh
        access token (when one was handed), then the userinfo endpoint's claims. A
        refusal (``invalid_grant``, 401) means the provider no longer vouches for them."""
        found = await self._discovered()
        if isinstance(found, Problem):
            return Unreachable(found.message)
        try:
            async with self._client() as http:
                if refresh_token is not None:
                    granted = await self._refresh_grant(http, found, refresh_token)
                    if not isinstance(granted, dict):
                        return granted
                    access_token = _text(granted.get("access_token")) or access_token
                    refresh_token = _text(granted.get("refresh_token")) or refresh_token
                if access_token is None or not isinstance(found.get("userinfo_endpoint"), str):
                    return Gone("the provider handed no token to ask it again with")
                answer = await http.get(
                    found["userinfo_endpoint"],
                    headers={"Authorization": f"Bearer {access_token}"},
                )
        except httpx.HTTPError as exc:
            return Unreachable(f"the identity provider could not be reached: {type(exc).__name__}")
        if answer.status_code in (401, 403):
            return Gone(f"the provider refused its own token ({answer.status_code})")
        if answer.status_code != 200:
            return Unreachable(f"userinfo answered {answer.status_code}")
        claims = _json(answer)
        if claims.get("sub") != subject:
            return Gone("userinfo names another subject")
        groups = _groups(claims, self.groups_claim)
        if isinstance(groups, Problem):
            return Gone(groups.message)
        return Refreshed(groups, refresh_token=refresh_token, access_token=access_token)

    async def _refresh_grant(
        self, http: httpx.AsyncClient, found: dict[str, Any], refresh_token: str
    ) -> dict[str, Any] | Gone | Unreachable:
        body = prepare_token_request(
            "refresh_token", refresh_token=refresh_token, client_id=self.client_id
        )
        auth = (self.client_id, self.client_secret) if self.client_secret else None
        answer = await http.post(
            found["token_endpoint"],
            content=body,
            auth=auth,  # type: ignore[arg-type]
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        if answer.status_code == 200:
            return _json(answer)
        error = _json(answer).get("error")
        if answer.status_code in (400, 401) and error in ("invalid_grant", "unauthorized_client"):
            return Gone(f"the provider refused the refresh token ({error})")
        return Unreachable(f"the token endpoint answered {answer.status_code} {error or ''}")

    async def verify_id_token(self, id_token: str, nonce: str) -> Person | Problem:
        """The person an ID token names, once its signature (the provider's published
        keys), ``iss``, ``aud`` (and ``azp`` where it names several audiences), ``exp``
        and ``nonce`` check out, and every claim read has the type the spec gives it."""
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.PyJWTError:
            return Problem(400, "id_token: not a JWT")
        if header.get("alg") not in ALGORITHMS:
            return Problem(400, f"id_token: unsupported algorithm {header.get('alg')!r}")
        kid = header.get("kid") if isinstance(header.get("kid"), str) else None
        claims = await self._decode(id_token, kid)
        if claims is None and kid is None:
            # a provider that names no kid may have rotated its only key: fetch the
            # keys once more (rate-limited like any refetch) and try again
            await anyio.to_thread.run_sync(self._refetch_keys)
            claims = await self._decode(id_token, kid)
        if claims is None:
            return Problem(400, "id_token: bad signature")
        if isinstance(claims, Problem):
            return claims
        return self._person(claims, nonce)

    async def _decode(self, id_token: str, kid: str | None) -> dict[str, Any] | Problem | None:
        """The verified claims; None when the signature does not match the key held."""
        key = await self._key(kid)
        if isinstance(key, Problem):
            return key
        try:
            return jwt.decode(
                id_token,
                key,
                algorithms=list(ALGORITHMS),
                audience=self.client_id,
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": ["iss", "aud", "exp", "iat", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            return Problem(400, "id_token: expired")
        except jwt.InvalidAudienceError:
            return Problem(400, "id_token: wrong audience")
        except jwt.InvalidIssuerError:
            return Problem(400, "id_token: wrong issuer")
        except jwt.InvalidSignatureError:
            return None
        except jwt.PyJWTError as exc:
            return Problem(400, f"id_token: {exc}")

    def _person(self, claims: dict[str, Any], nonce: str) -> Person | Problem:
        got = claims.get("nonce")
        if not isinstance(got, str) or not hmac.compare_digest(got.encode(), nonce.encode()):
            return Problem(400, "nonce: the ID token's nonce is not the one this sign-in sent")
        audience = claims.get("aud")
        azp = claims.get("azp")
        if azp is not None and azp != self.client_id:
            return Problem(400, "id_token: azp names another client")
        if isinstance(audience, list) and len(audience) > 1 and azp is None:
            # OIDC Core 3.1.3.7: several audiences need azp naming this client
            return Problem(400, "id_token: several audiences and no azp")
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            return Problem(400, "id_token: sub must be a non-empty string")
        groups = _groups(claims, self.groups_claim)
        if isinstance(groups, Problem):
            return groups
        email = claims.get("email")
        if email is not None and not isinstance(email, str):
            return Problem(400, "id_token: email must be a string")
        # an address the provider has not verified names nobody (OIDC Core 5.1, 5.7)
        verified = claims.get("email_verified") in (True, "true")
        return Person(
            subject=subject,
            email=email if email and verified else None,
            groups=groups,
        )

    def keys(self) -> dict[str, IssuerKeys]:
        """The provider's keys by issuer, once discovery named them (their health)."""
        return {} if self._keys is None else {self.issuer: self._keys}

    def _refetch_keys(self) -> None:
        if self._keys is not None:
            self._keys.refresh(wait=True)

    async def _discovered(self) -> dict[str, Any] | Problem:
        """The provider's discovery document, fetched once and kept."""
        if self._discovery is not None:
            return self._discovery
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            async with self._client() as http:
                doc = _json(await http.get(url))
        except httpx.HTTPError as exc:
            return Problem(502, f"the identity provider could not be reached: {type(exc).__name__}")
        if doc.get("issuer") != self.issuer:
            return Problem(502, "the identity provider's discovery names another issuer")
        needed = ("authorization_endpoint", "token_endpoint", "jwks_uri")
        if not all(isinstance(doc.get(k), str) for k in needed):
            return Problem(502, "the identity provider's discovery lacks " + ", ".join(needed))
        self._discovery = doc
        return doc

    async def _key(self, kid: str | None) -> jwt.PyJWK | Problem:
        """The provider's key ``kid``, kept and refreshed as a pod issuer's are
        (``IssuerKeys``: fetched again for a ``kid`` they lack at most every REFETCH_S,
        and once they are an hour old), from the discovery document's ``jwks_uri``."""
        if self._keys is None:
            found = await self._discovered()
            if isinstance(found, Problem):
                return found
            source = ProviderKeys(self.issuer, found["jwks_uri"])
            self._keys = IssuerKeys(
                source, algorithms=ALGORITHMS, refetch_s=REFETCH_S, max_age_s=KEYS_MAX_AGE_S
            )
        key = await anyio.to_thread.run_sync(self._keys.key, kid)
        if isinstance(key, KeyProblem):
            if key.status == 503:
                return Problem(502, "the provider's keys could not be had")
            return Problem(400, f"id_token: {key.reason}")
        return key


@dataclass(frozen=True)
class ProviderKeys:
    """Where the provider's keys are (``workload_keys.KeySource``): its discovery
    document's ``jwks_uri``."""

    issuer: str
    jwks_uri: str
    jwks_file: None = None

    @property
    def discovery_url(self) -> str:
        return self.issuer.rstrip("/") + "/.well-known/openid-configuration"


def _groups(claims: dict[str, Any], name: str) -> tuple[str, ...] | Problem:
    """The groups claim: a list of strings (one string is taken as a list of one)."""
    groups = claims.get(name)
    if groups is None:
        return ()
    if isinstance(groups, str):
        return (groups,)
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        return Problem(400, f"id_token: the {name} claim must be a list of strings")
    return tuple(groups)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _refused(answer: httpx.Response) -> Problem:
    """The token endpoint's refusal, with the provider's own error code (RFC 6749
    5.2: ``invalid_client`` means this service's client id or secret is wrong,
    ``invalid_grant`` a stale or replayed code), logged for the operator."""
    body = _json(answer)
    error = body.get("error") if isinstance(body.get("error"), str) else None
    said = body.get("error_description")
    log.warning(
        "the identity provider refused the code exchange: HTTP %d %s%s",
        answer.status_code,
        error or "(no error code)",
        f": {said}" if isinstance(said, str) else "",
    )
    hint = {
        "invalid_client": "check SWITCHBOARD_OIDC_CLIENT_ID and SWITCHBOARD_OIDC_CLIENT_SECRET",
        "invalid_grant": "the sign-in took too long or was replayed: sign in again",
    }.get(error or "", "see the service's log")
    code = f"{answer.status_code} {error}" if error else str(answer.status_code)
    return Problem(400, f"code: the identity provider refused it ({code}); {hint}")


def _json(answer: httpx.Response) -> dict[str, Any]:
    try:
        data = answer.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
