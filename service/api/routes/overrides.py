"""``/v1/overrides``: per-cluster (or fleet-wide ``*``) force/deny/policy flags.

Every write is audited with its note and the preview's counts, honours ``If-Match``,
and can be tried first with ``?dry_run=true`` (answers the preview, changes nothing).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Response
from fastapi.responses import JSONResponse
from mla_switchboard.core.rollouts import RolloutAction
from mla_switchboard.core.schemas import (
    NONBLANK,
    OVERRIDE_SCOPE_PATTERN,
    OverrideSpec,
    Percent,
    error_responses,
)
from mla_switchboard.service.api.deps import (
    AdminDep,
    OverrideWritesDep,
    SnapshotDep,
    ViewerDep,
    fail,
)
from mla_switchboard.service.api.etags import etag_matches
from mla_switchboard.service.api.outcomes import respond
from mla_switchboard.service.api.params import AuditNote, IfNoneMatch, WriteControlsDep
from mla_switchboard.service.reads import overrides, scope
from mla_switchboard.service.state import override_etag
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

router = APIRouter(prefix="/v1/overrides", tags=["overrides"], responses=error_responses(401, 403))

Scope = Annotated[
    str,
    Path(
        pattern=OVERRIDE_SCOPE_PATTERN,
        max_length=63,
        description="a cluster name, or * for the whole fleet",
    ),
]


@router.get(
    "",
    summary="Every override, expired ones flagged",
    responses={304: {"description": "If-None-Match matched: nothing changed"}},
)
def list_overrides(
    snapshot: SnapshotDep,
    principal: ViewerDep,
    if_none_match: IfNoneMatch = None,
) -> Response:
    snap = snapshot
    now = datetime.now(UTC)
    mine = overrides.visible(principal, snap.overrides)
    # what is shown changes with the config version and with each expiry passing
    expired = sum(1 for o in mine if o.expires_at is not None and o.expires_at <= now)
    etag = scope.etag(principal, f'"overrides-{snap.version}-{expired}"')
    if etag_matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    items = [overrides.shown_to(principal, o, now) for o in mine]
    return JSONResponse({"items": items}, headers={"ETag": etag})


@router.get(
    "/{cluster}",
    summary="One scope's override",
    responses={304: {"description": "If-None-Match matched"}, **error_responses(404)},
)
def get_override(
    cluster: Scope,
    snapshot: SnapshotDep,
    principal: ViewerDep,
    if_none_match: IfNoneMatch = None,
) -> Response:
    found = next((o for o in snapshot.overrides if o.cluster == cluster), None)
    if found is None or not principal.may_see(cluster):
        fail(404, f"no override for {cluster!r}")
    etag = override_etag(cluster, found.revision)
    if cluster == "*":  # the one override a scoped caller may read but not write
        etag = scope.etag(principal, etag)
    if etag_matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    shown = overrides.shown_to(principal, found, datetime.now(UTC))
    return JSONResponse(shown, headers={"ETag": etag})


@router.put(
    "/{cluster}",
    summary="Create or replace a scope's override",
    responses=error_responses(409, 412, 413, 503),
)
def put_override(
    cluster: Scope,
    spec: OverrideSpec,
    writes: OverrideWritesDep,
    principal: AdminDep,
    control: WriteControlsDep,
) -> Response:
    if_match = control.if_match
    key = control.key("PUT override", cluster, spec.model_dump(mode="json"), if_match)
    return respond(
        writes.put_override(
            principal, cluster, spec, if_match=if_match, dry_run=control.dry_run, key=key
        )
    )


@router.delete(
    "/{cluster}",
    summary="Remove a scope's override",
    responses=error_responses(404, 409, 412, 503),
)
def delete_override(
    cluster: Scope,
    writes: OverrideWritesDep,
    principal: AdminDep,
    control: WriteControlsDep,
    note: AuditNote = None,
) -> Response:
    if_match = control.if_match
    key = control.key("DELETE override", cluster, note, if_match)
    return respond(
        writes.delete_override(
            principal, cluster, if_match=if_match, dry_run=control.dry_run, note=note, key=key
        )
    )


class RolloutActionBody(BaseModel):
    """An admin's hand on a staged override."""

    model_config = ConfigDict(
        extra="forbid",
        # percent goes with promote only (as the validator below says)
        json_schema_extra={
            "if": {"properties": {"action": {"not": {"const": "promote"}}}},
            "then": {"not": {"required": ["percent"]}},
        },
    )
    action: RolloutAction = Field(
        description="halt (pods go back to what they ran without it), resume (a new stage "
        "starts) or promote (to `percent`, by default the next step)"
    )
    percent: Percent | None = Field(default=None, description="promote only: the new stage")
    note: Annotated[
        str,
        StringConstraints(strip_whitespace=True, min_length=1, max_length=2000, pattern=NONBLANK),
    ] = Field(description="why, for the audit log")

    @model_validator(mode="after")
    def _percent_for_promote(self) -> RolloutActionBody:
        if self.percent is not None and self.action != "promote":
            raise ValueError("percent goes with action promote only")
        return self


@router.post(
    "/{cluster}/rollout",
    summary="Halt, resume or promote a staged override",
    responses=error_responses(404, 409, 412, 413, 503),
)
def rollout_action(
    cluster: Scope,
    body: RolloutActionBody,
    writes: OverrideWritesDep,
    principal: AdminDep,
    control: WriteControlsDep,
) -> Response:
    """``?dry_run=true`` answers the rollout it would store and the preview of the pods
    that would change, and changes nothing: what the dashboard's confirmation shows."""
    if_match = control.if_match
    key = control.key("POST rollout", cluster, body.model_dump(mode="json"), if_match)
    return respond(
        writes.rollout_action(
            principal,
            cluster,
            body.action,
            note=body.note,
            to=body.percent,
            if_match=if_match,
            dry_run=control.dry_run,
            key=key,
        )
    )
