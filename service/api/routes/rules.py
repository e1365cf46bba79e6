"""``/v1/rules``: the priority lists, read by anyone with a viewer token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import JSONResponse
from mla_switchboard.core.schemas import NO_NUL, RulesDocument, error_responses
from mla_switchboard.service.api.changes import committed, preview_change
from mla_switchboard.service.api.deps import AdminDep, RuntimeDep, ViewerDep, check_scope, fail
from mla_switchboard.service.state import rules_etag

router = APIRouter(prefix="/v1/rules", tags=["rules"], responses=error_responses(401, 403))


def etag_matches(header: str | None, etag: str) -> bool:
    if header is None:
        return False
    tags = {t.strip().removeprefix("W/") for t in header.split(",")}
    return "*" in tags or etag in tags


@router.get(
    "",
    response_model=RulesDocument,
    responses={304: {"description": "If-None-Match matched"}},
    summary="The priority rules in force, with their revision",
)
def get_rules(
    runtime: RuntimeDep,
    _: ViewerDep,
    response: Response,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response | RulesDocument:
    rules = runtime.snapshot.rules
    etag = rules_etag(rules.revision or 0)
    if etag_matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    response.headers["ETag"] = etag
    return rules


def _touched_clusters(old: RulesDocument, new: RulesDocument) -> set[str] | None:
    """Clusters whose rule sets differ, or None when the fleet rules differ."""
    if old.default != new.default or old.by_capability != new.by_capability:
        return None
    names = set(old.clusters) | set(new.clusters)
    return {c for c in names if old.clusters.get(c) != new.clusters.get(c)}


@router.put(
    "",
    summary="Replace the priority rules (accepts what GET returns)",
    responses=error_responses(412, 413, 503),
)
def put_rules(
    document: RulesDocument,
    runtime: RuntimeDep,
    principal: AdminDep,
    dry_run: Annotated[bool, Query(description="answer the preview, change nothing")] = False,
    if_match: Annotated[str | None, Header(description="ETag from GET; stale -> 412")] = None,
    note: Annotated[
        str | None, Query(max_length=2000, pattern=NO_NUL, description="why, for the audit log")
    ] = None,
) -> Response:
    current = runtime.snapshot.rules
    if principal.clusters is not None:
        touched = _touched_clusters(current, document)
        if touched is None:
            fail(
                403,
                f"token {principal.name!r} is limited to clusters; fleet rules need an "
                "unrestricted admin token",
            )
        for cluster in sorted(touched):
            check_scope(principal, cluster)
    preview = preview_change(runtime, rules=document)
    if dry_run:
        return JSONResponse({"dry_run": True, "preview": preview.model_dump()})
    stored = committed(
        runtime,
        runtime.store.put_rules(
            document,
            actor=principal.name,
            if_match=if_match,
            note=note,
            preview={k: v for k, v in preview.model_dump().items() if k != "invalid"},
        ),
        "rules",
    )
    return JSONResponse(
        {"rules": stored.model_dump(mode="json"), "preview": preview.model_dump()},
        headers={"ETag": rules_etag(stored.revision or 0)},
    )
