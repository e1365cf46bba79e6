"""Tokens, the audit log, and the stand-alone impact preview."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Response
from mla_switchboard.core import rollouts
from mla_switchboard.core.schemas import (
    NO_NUL,
    NONBLANK,
    ClusterGlobs,
    Override,
    OverrideScope,
    OverrideSpec,
    RulesDocument,
    error_responses,
)
from mla_switchboard.service.api.deps import (
    AdminDep,
    AuditDep,
    PreviewsDep,
    SnapshotDep,
    TokenDep,
    TokenWritesDep,
    ViewerDep,
)
from mla_switchboard.service.api.etags import conditional
from mla_switchboard.service.api.outcomes import respond
from mla_switchboard.service.api.params import IdempotencyKeyHeader, IfNoneMatch
from mla_switchboard.service.fleet.preview import Preview
from mla_switchboard.service.fleet.reads import Proposal
from mla_switchboard.service.writes import IdempotencyKey
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)
from starlette.concurrency import run_in_threadpool

router = APIRouter(prefix="/v1", tags=["admin"], responses=error_responses(401, 403))


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[
        str,
        StringConstraints(strip_whitespace=True, min_length=1, max_length=100, pattern=NONBLANK),
    ]
    role: Literal["agent", "viewer", "admin"]
    clusters: ClusterGlobs | None = Field(
        default=None,
        description="cluster globs (prod-*), at least one; null = every cluster "
        "(an empty list is refused: it would limit the token to nothing)",
    )


class TokenCreated(BaseModel):
    id: str
    name: str
    role: str
    clusters: list[str] | None
    token: str = Field(description="shown once; only its hash is stored")


@router.post(
    "/tokens",
    status_code=201,
    response_model=TokenCreated,
    responses=error_responses(413, 503),
    summary="Create a token",
)
def create_token(
    body: TokenRequest,
    writes: TokenWritesDep,
    principal: AdminDep,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """The token's secret is in this answer only (the store keeps its hash): a retry with
    the same Idempotency-Key says the token exists, without the secret."""
    key = IdempotencyKey.of(idempotency_key, "POST tokens", body.model_dump(mode="json"))
    return respond(
        writes.create_token(
            principal, name=body.name, role=body.role, clusters=body.clusters, key=key
        )
    )


class Identity(BaseModel):
    name: str
    role: str
    clusters: list[str] | None = Field(description="cluster globs the token is limited to")
    may_edit_fleet: bool = Field(description="an unrestricted admin: fleet rules, `*`, tokens")


@router.get("/whoami", response_model=Identity, summary="The caller's token: name, role, scope")
async def whoami(principal: TokenDep) -> dict[str, Any]:
    """What the dashboard needs to show only the controls a token may use (any role)."""
    return {
        "name": principal.name,
        "role": principal.role,
        "clusters": None if principal.clusters is None else list(principal.clusters),
        "may_edit_fleet": principal.role == "admin" and not principal.restricted,
    }


@router.get("/tokens", summary="Tokens (never their secrets)")
def list_tokens(snapshot: SnapshotDep, principal: AdminDep) -> dict[str, Any]:
    """An admin token limited to some clusters lists only the tokens whose every
    cluster lies in its scope (never an unrestricted one)."""
    tokens = sorted(
        (t for t in snapshot.tokens.values() if principal.covers(t.clusters)),
        key=lambda t: t.created_at,
    )
    return {
        "items": [
            {
                "id": t.id,
                "name": t.name,
                "role": t.role,
                "clusters": None if t.clusters is None else list(t.clusters),
                "created_at": t.created_at.isoformat(),
                "revoked": t.revoked,
            }
            for t in tokens
        ]
    }


@router.delete(
    "/tokens/{token_id}",
    status_code=204,
    responses=error_responses(404, 503),
    summary="Revoke a token",
)
def revoke_token(
    token_id: Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")],
    writes: TokenWritesDep,
    principal: AdminDep,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    key = IdempotencyKey.of(idempotency_key, "DELETE tokens", token_id)
    return respond(writes.revoke_token(principal, token_id, key=key))


@router.get(
    "/audit",
    responses=error_responses(503),
    summary="The append-only audit log, newest first",
)
def audit(
    reads: AuditDep,
    principal: ViewerDep,
    action: Annotated[str | None, Query(max_length=64, pattern=NO_NUL)] = None,
    target: Annotated[str | None, Query(max_length=100, pattern=NO_NUL)] = None,
    actor: Annotated[str | None, Query(max_length=100, pattern=NO_NUL)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    # ASCII digits only, at most 18 (below 2**63): str.isdigit() let "²" through to
    # int() and 20 digits overflowed the database's integer, both answered 500.
    cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,18}$")] = None,
    if_none_match: IfNoneMatch = None,
) -> Response:
    """Answered with an ETag of its content: a poll that finds nothing new gets 304."""
    page = reads.page(
        principal, action=action, target=target, actor=actor, limit=limit, cursor=cursor
    )
    return conditional(page, if_none_match)


class OverrideProposal(OverrideSpec):
    cluster: OverrideScope


def _omittable(schema: dict[str, Any]) -> None:
    """Absent, not null (null is refused): drop the null branch and the default."""
    schema.pop("default", None)
    branches = [s for s in schema.pop("anyOf", []) if s.get("type") != "null"]
    if branches:
        schema.update(branches[0])


# _omittable and min/maxProperties: the OpenAPI says "exactly one of these keys, none
# null", as the validators below do (schemathesis sent three nulls, which the schema
# admitted and the server refused).
_Omittable = Field(default=None, json_schema_extra=_omittable)


class PreviewRequest(BaseModel):
    """Exactly one proposal: new rules, an override to put, or one to delete."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"minProperties": 1, "maxProperties": 1}
    )
    rules: RulesDocument | None = _Omittable
    override: OverrideProposal | None = _Omittable
    delete_override: OverrideScope | None = _Omittable

    @field_validator("rules", "override", "delete_override", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("leave the key out instead of sending null")
        return value

    @model_validator(mode="after")
    def _one(self) -> PreviewRequest:
        given = [self.rules, self.override, self.delete_override]
        if sum(x is not None for x in given) != 1:
            raise ValueError("give exactly one of rules, override, delete_override")
        return self


@router.post(
    "/preview",
    response_model=Preview,
    responses=error_responses(413, 503),
    summary="What a change would do to the fleet",
)
async def preview(body: PreviewRequest, previews: PreviewsDep, principal: ViewerDep) -> Response:
    """A token limited to some clusters previews the change on its clusters' pods. The
    fleet is replayed by group in a worker thread, and the answer kept until a version
    it depends on moves (see service/fleet/reads.py); a kept one is sent from the
    event loop at once."""
    if body.rules is not None:
        proposal = Proposal(rules=body.rules)
    elif body.override is not None:
        # as PUT /v1/overrides stores it: a staged override with its rollout's state
        # (its id chooses the stage's pods, as the write will)
        scope = body.override.cluster
        spec = OverrideSpec.model_validate(body.override.model_dump(exclude={"cluster"}))
        override = Override.model_validate(
            {
                **rollouts.stored_payload(scope, spec, datetime.now(UTC)),
                "cluster": scope,
                "created_at": datetime.now(UTC),
                "created_by": "preview",
                "revision": 0,
            }
        )
        proposal = Proposal(override_scope=scope, override=override)
    else:
        proposal = Proposal(override_scope=body.delete_override, override=None)
    answer = previews.kept_preview(principal, proposal)
    if answer is None:
        answer = await run_in_threadpool(lambda: previews.preview(principal, proposal))
    return Response(answer.model_dump_json(), media_type="application/json")
