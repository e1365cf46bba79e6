"""Shared dependencies of the routes: the services they call, authentication, error
helpers. Each service comes from the app's state through a ``Depends`` function, so a
route names the one service it calls and never reaches through the runtime."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any, NoReturn, TypeVar

import anyio.to_thread
from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from mla_switchboard.core.schemas import SelectRequest
from mla_switchboard.service.fleet.reads import FleetReads
from mla_switchboard.service.gitops.drift import Drift
from mla_switchboard.service.gitops.planning import OverridesAsCode
from mla_switchboard.service.identity.auth import Principal, Role, authenticate, identity_problem
from mla_switchboard.service.identity.oidc import RelyingParty
from mla_switchboard.service.identity.people import CSRF_HEADER, SESSION_COOKIE, People, csrf_ok
from mla_switchboard.service.identity.throttle import FailureThrottle
from mla_switchboard.service.identity.workload import (
    PodIdentity,
    Rejected,
    WorkloadVerifier,
    looks_like_jwt,
)
from mla_switchboard.service.live.events import EventHub
from mla_switchboard.service.live.poller import LiveConfig
from mla_switchboard.service.outcomes import Problem
from mla_switchboard.service.reads.audit import AuditReads
from mla_switchboard.service.reads.health import Health
from mla_switchboard.service.reads.pods import PodReads
from mla_switchboard.service.reads.previews import Previews
from mla_switchboard.service.reads.selections import SelectionReads
from mla_switchboard.service.refused import RefusedSelects
from mla_switchboard.service.reports import Reports
from mla_switchboard.service.runtime import Runtime
from mla_switchboard.service.state import ConfigSnapshot
from mla_switchboard.service.writes.evidence import EvidenceWrites
from mla_switchboard.service.writes.overrides import OverrideWrites
from mla_switchboard.service.writes.rules import RulesWrites
from mla_switchboard.service.writes.tokens import TokenWrites
from starlette.types import Scope

bearer = HTTPBearer(
    auto_error=False,
    description="sb_<id>_<secret> token, the bootstrap token, or (agents of a cluster with "
    "a workload issuer) the pod's Kubernetes service-account token",
)


T = TypeVar("T")


def _runtime(request: Request) -> Runtime:
    return request.app.state.runtime


def _service(pick: Callable[[Runtime], T]) -> Callable[[Request], Coroutine[Any, Any, T]]:
    """A dependency answering the part of the app's runtime ``pick`` names. Async: a
    sync dependency would cost a thread-pool hop on every request."""

    async def dependency(request: Request) -> T:
        return pick(_runtime(request))

    return dependency


get_snapshot = _service(lambda r: r.live.current())
"""The configuration in force (rules, overrides, tokens)."""
get_decider = _service(lambda r: r.decider)
get_refused = _service(lambda r: r.refused_selects)
get_workload = _service(lambda r: r.workload)

SnapshotDep = Annotated[ConfigSnapshot, Depends(get_snapshot)]
PodsDep = Annotated[PodReads, Depends(_service(lambda r: r.pods))]
SelectionsDep = Annotated[SelectionReads, Depends(_service(lambda r: r.selections))]
FleetReadsDep = Annotated[FleetReads, Depends(_service(lambda r: r.reads))]
PreviewsDep = Annotated[Previews, Depends(_service(lambda r: r.previews))]
AuditDep = Annotated[AuditReads, Depends(_service(lambda r: r.audit))]
HealthDep = Annotated[Health, Depends(_service(lambda r: r.health))]
RefusedDep = Annotated[RefusedSelects, Depends(get_refused)]
ReportsDep = Annotated[Reports, Depends(_service(lambda r: r.reports))]
OverrideWritesDep = Annotated[OverrideWrites, Depends(_service(lambda r: r.override_writes))]
RulesWritesDep = Annotated[RulesWrites, Depends(_service(lambda r: r.rules_writes))]
OverridesAsCodeDep = Annotated[OverridesAsCode, Depends(_service(lambda r: r.overrides_as_code))]
DriftDep = Annotated[Drift, Depends(_service(lambda r: r.drift))]
TokenWritesDep = Annotated[TokenWrites, Depends(_service(lambda r: r.token_writes))]
EvidenceWritesDep = Annotated[EvidenceWrites, Depends(_service(lambda r: r.evidence_writes))]
PeopleDep = Annotated[People, Depends(_service(lambda r: r.people))]
EventsDep = Annotated[EventHub, Depends(_service(lambda r: r.events))]
RelyingPartyDep = Annotated[RelyingParty | None, Depends(_service(lambda r: r.relying_party))]


def fail(status: int, message: str, **extra: Any) -> NoReturn:
    """An error answer: ``{"detail": {"message": ..., **extra}}``."""
    raise HTTPException(status_code=status, detail={"message": message, **extra})


def invalid(location: tuple[str | int, ...], message: str) -> NoReturn:
    """A 422 shaped like FastAPI's own validation errors, for checks done by hand."""
    raise HTTPException(
        status_code=422,
        detail=[{"loc": list(location), "msg": message, "type": "value_error"}],
    )


def principal_from(request: Request, role: Role | None) -> Principal:
    """Authenticate the request's bearer token and check its role; raises 401/403/429."""
    runtime = _runtime(request)
    header = request.headers.get("authorization", "")
    return authorize(
        header,
        runtime.live,
        runtime.bootstrap_token,
        role,
        wrong_tokens=runtime.wrong_tokens,
        client=client_address(request.scope),
        workload=runtime.workload,
    )


async def verify_workload(authorization: str, workload: WorkloadVerifier) -> None:
    """Verify a workload token not seen before on a worker thread (a signature check,
    maybe a key fetch), so that :func:`authorize`, called next on the event loop, finds
    it kept; a token seen before costs a dict lookup here."""
    token = authorization.partition(" ")[2].strip()
    if workload.needs_verifying(token):
        await anyio.to_thread.run_sync(workload.verify, token)


def client_address(scope: Scope) -> str:
    """The address a request came from, as the server gives it (uvicorn takes it from
    ``X-Forwarded-For`` only when the peer is in ``FORWARDED_ALLOW_IPS``)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def authorize(
    authorization: str,
    live: LiveConfig,
    bootstrap: str | None,
    role: Role | None,
    *,
    wrong_tokens: FailureThrottle,
    client: str,
    workload: WorkloadVerifier | None = None,
) -> Principal:
    """The principal of an ``Authorization`` header's bearer token, if it has ``role``
    (None: any role); raises 401/403, or 429 for a wrong token from a ``client``
    address that has sent too many (a valid token is checked first and never throttled;
    a rejected workload token counts as a wrong one), or 503 when a workload issuer's
    keys cannot be had.

    Takes the header's text rather than a request, so that the lean ``/v1/select``
    handler (service/api/select_asgi.py), which has no Starlette request, gives the
    same answers as every other route (which call it through ``require``).
    """
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(
            401,
            detail={"message": "missing bearer token (Authorization: Bearer <token>)"},
            headers={"WWW-Authenticate": "Bearer"},
        )
    token = token.strip()
    rejected: Rejected | None = None
    if workload is not None and workload.enabled and looks_like_jwt(token):
        principal, rejected = _workload_principal(workload.verify(token))
    else:
        principal = authenticate(token, live.current().tokens, bootstrap)
    if principal is None:
        retry_after = wrong_tokens.wrong_token(client)
        if retry_after is not None:
            raise HTTPException(
                429,
                detail={
                    "message": "too many wrong tokens from this address; "
                    f"try again in {retry_after} s"
                },
                headers={"Retry-After": str(retry_after)},
            )
        message = "unknown or revoked token"
        if rejected is not None:
            message = f"workload token rejected: {rejected.reason}"
        raise HTTPException(
            401,
            detail={"message": message},
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    if role is not None and not principal.has(role):
        fail(403, f"token {principal.name!r} has role {principal.role}; this needs {role}")
    return principal


def _workload_principal(
    verified: PodIdentity | Rejected,
) -> tuple[Principal | None, Rejected | None]:
    """A verified pod's principal, or why its token was rejected (401, answered as a
    wrong token); 403 raised for a pod whose service account may not act as an agent,
    503 when the issuer's keys could not be had."""
    if isinstance(verified, PodIdentity):
        return Principal.of_pod(verified), None
    if verified.status == 403:
        # a genuine token of a pod whose service account the issuer does not bind
        fail(403, f"workload token refused: {verified.reason}")
    if verified.status == 503:
        raise HTTPException(
            503,
            detail={"message": f"workload token not checked: {verified.reason}"},
            headers={"Retry-After": "5"},
        )
    return None, verified


def act_as(
    principal: Principal, body: SelectRequest, workload: WorkloadVerifier, dry_run: bool
) -> SelectRequest:
    """The select request ``principal`` may make, or 401/403: a verified pod selects only
    as itself in its own cluster, and a request naming no pod is recorded under the
    token's pod; a static token may not select for a cluster with an issuer, except a
    dry run (it records nothing, so it speaks for no pod)."""
    requires = not dry_run and workload.requires_identity(body.cluster)
    problem = identity_problem(principal, body.cluster, body.pod, requires)
    if problem is not None:
        fail(problem.status, problem.message, **problem.extra)
    check_scope(principal, body.cluster)
    if principal.pod is not None and body.pod is None:
        return body.model_copy(update={"pod": principal.pod.pod})
    return body


def require(role: Role | None) -> Callable[..., Principal]:
    async def dependency(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        # ``credentials`` is declared so that OpenAPI shows the bearer scheme.
        if not request.headers.get("authorization") and SESSION_COOKIE in request.cookies:
            return await person_from(request, role)
        await verify_workload(request.headers.get("authorization", ""), await get_workload(request))
        return principal_from(request, role)

    dependency.__name__ = f"require_{role or 'token'}"
    return dependency


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def person_from(request: Request, role: Role | None) -> Principal:
    """The signed-in person of the request's session cookie (a bearer token, when
    present, wins: automation never depends on a browser's cookie); 401 when the
    session is unknown, signed out or expired, 403 for a write without the session's
    CSRF token or for a role the person's groups do not give."""
    session_id = request.cookies[SESSION_COOKIE]
    runtime = _runtime(request)
    people = runtime.people
    found = await anyio.to_thread.run_sync(people.session, session_id)
    if found is not None:
        found = await people.current(found, runtime.relying_party)
    if found is None:
        raise HTTPException(
            401,
            detail={"message": "session expired, signed out or revoked; sign in again"},
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = people.principal_of(found)
    if isinstance(principal, Problem):
        fail(principal.status, principal.message)
    if request.method not in SAFE_METHODS and not csrf_ok(
        session_id, request.headers.get(CSRF_HEADER, "")
    ):
        fail(
            403,
            f"{CSRF_HEADER}: a write signed in by cookie must carry the session's CSRF "
            "token (GET /auth/session)",
            field=CSRF_HEADER,
        )
    if role is not None and not principal.has(role):
        fail(403, f"{principal.name!r} has role {principal.role}; this needs {role}")
    return principal


AgentDep = Annotated[Principal, Depends(require("agent"))]
ViewerDep = Annotated[Principal, Depends(require("viewer"))]
AdminDep = Annotated[Principal, Depends(require("admin"))]
TokenDep = Annotated[Principal, Depends(require(None))]
"""Any valid token, whatever its role."""


def check_scope(principal: Principal, cluster: str) -> None:
    if not principal.may_touch(cluster):
        fail(403, principal.out_of_scope(cluster))


def metrics_scope(request: Request) -> Callable[[str], bool] | None:
    """Which cluster labels ``/metrics`` may show this caller: none without a token
    (401 when ``SWITCHBOARD_METRICS_REQUIRE_TOKEN`` is on), a viewer token's clusters."""
    if not request.headers.get("authorization", "").strip():
        if _runtime(request).settings.metrics_require_token:
            raise HTTPException(
                401,
                detail={"message": "metrics need a viewer token (Authorization: Bearer)"},
                headers={"WWW-Authenticate": "Bearer"},
            )
        return None
    return principal_from(request, "viewer").may_see
