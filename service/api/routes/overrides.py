"""``/v1/overrides``: per-cluster (or fleet-wide ``*``) force/deny/policy flags.

Every write is audited with its note and the preview's counts, honours ``If-Match``,
and can be tried first with ``?dry_run=true`` (answers the preview, changes nothing).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response
from fastapi.responses import JSONResponse
from mla_switchboard.core import rollouts
from mla_switchboard.core.schemas import (
    NO_NUL,
    OVERRIDE_SCOPE_PATTERN,
    Override,
    OverrideSpec,
    error_responses,
)
from mla_switchboard.service.api.changes import committed, preview_change
from mla_switchboard.service.api.deps import (
    AdminDep,
    RuntimeDep,
    ViewerDep,
    check_scope,
    fail,
    invalid,
)
from mla_switchboard.service.api.etags import etag_matches
from mla_switchboard.service.state import override_etag

router = APIRouter(prefix="/v1/overrides", tags=["overrides"], responses=error_responses(401, 403))

Scope = Annotated[
    str,
    Path(
        pattern=OVERRIDE_SCOPE_PATTERN,
        max_length=63,
        description="a cluster name, or * for the whole fleet",
    ),
]
DryRun = Annotated[bool, Query(description="answer the preview and change nothing")]
IfMatch = Annotated[str | None, Header(description="ETag from a GET; stale -> 412")]


def _shown(o: Override, now: datetime) -> dict[str, Any]:
    d = o.model_dump(mode="json")
    d["expired"] = o.expires_at is not None and o.expires_at <= now
    return d


@router.get(
    "",
    summary="Every override, expired ones flagged",
    responses={304: {"description": "If-None-Match matched: nothing changed"}},
)
def list_overrides(
    runtime: RuntimeDep,
    principal: ViewerDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    snap = runtime.snapshot
    now = datetime.now(UTC)
    mine = [o for o in snap.overrides if principal.may_see(o.cluster)]
    # what is shown changes with the config version and with each expiry passing
    expired = sum(1 for o in mine if o.expires_at is not None and o.expires_at <= now)
    etag = f'"overrides-{snap.version}-{expired}"'
    if etag_matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    items = [_shown(o, now) for o in sorted(mine, key=lambda o: o.cluster)]
    return JSONResponse({"items": items}, headers={"ETag": etag})


@router.get(
    "/{cluster}",
    summary="One scope's override",
    responses={304: {"description": "If-None-Match matched"}, **error_responses(404)},
)
def get_override(
    cluster: Scope,
    runtime: RuntimeDep,
    principal: ViewerDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    found = next((o for o in runtime.snapshot.overrides if o.cluster == cluster), None)
    if found is None or not principal.may_see(cluster):
        fail(404, f"no override for {cluster!r}")
    etag = override_etag(cluster, found.revision)
    if etag_matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    return JSONResponse(_shown(found, datetime.now(UTC)), headers={"ETag": etag})


@router.put(
    "/{cluster}",
    summary="Create or replace a scope's override",
    responses=error_responses(412, 413, 503),
)
def put_override(
    cluster: Scope,
    spec: OverrideSpec,
    runtime: RuntimeDep,
    principal: AdminDep,
    dry_run: DryRun = False,
    if_match: IfMatch = None,
) -> Response:
    check_scope(principal, cluster)
    now = datetime.now(UTC)
    if spec.expires_at is not None and spec.expires_at <= now:
        invalid(("body", "expires_at"), "expires_at is in the past")
    proposed = Override.model_validate(
        {
            **rollouts.stored_payload(cluster, spec, now),
            "cluster": cluster,
            "created_at": now,
            "created_by": principal.name,
            "revision": 0,
        }
    )
    preview = preview_change(runtime, override_scope=cluster, override=proposed)
    if dry_run:
        return JSONResponse({"dry_run": True, "preview": preview.model_dump()})
    stored = committed(
        runtime,
        runtime.store.put_override(
            cluster,
            spec,
            actor=principal.name,
            if_match=if_match,
            preview=_counts(preview.model_dump()),
        ),
        f"override {cluster!r}",
    )
    runtime.metrics.override_writes.labels("put").inc()
    return JSONResponse(
        {"override": _shown(stored, now), "preview": preview.model_dump()},
        headers={"ETag": override_etag(cluster, stored.revision)},
    )


@router.delete(
    "/{cluster}",
    summary="Remove a scope's override",
    responses=error_responses(404, 412, 503),
)
def delete_override(
    cluster: Scope,
    runtime: RuntimeDep,
    principal: AdminDep,
    dry_run: DryRun = False,
    if_match: IfMatch = None,
    note: Annotated[str | None, Query(max_length=2000, pattern=NO_NUL)] = None,
) -> Response:
    check_scope(principal, cluster)
    if not any(o.cluster == cluster for o in runtime.snapshot.overrides):
        runtime.live.reload()  # it may have been written on another replica just now
        if not any(o.cluster == cluster for o in runtime.snapshot.overrides):
            fail(404, f"no override for {cluster!r}")
    preview = preview_change(runtime, override_scope=cluster, override=None)
    if dry_run:
        return JSONResponse({"dry_run": True, "preview": preview.model_dump()})
    deleted = runtime.store.delete_override(
        cluster,
        actor=principal.name,
        if_match=if_match,
        note=note,
        preview=_counts(preview.model_dump()),
    )
    if deleted is None:
        fail(404, f"no override for {cluster!r}")
    committed(runtime, deleted, f"override {cluster!r}")
    runtime.metrics.override_writes.labels("delete").inc()
    return JSONResponse(
        {"deleted": deleted.model_dump(mode="json"), "preview": preview.model_dump()}
    )


def _counts(preview: dict[str, Any]) -> dict[str, Any]:
    """What the audit log keeps of a preview: the counts, not every change row."""
    return {k: preview[k] for k in ("pods_total", "pods_changed", "pods_invalid")} | {
        "changes": preview["changes"][:20]
    }
