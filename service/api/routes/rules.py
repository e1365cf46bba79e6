"""``/v1/rules``: the priority lists, read by anyone with a viewer token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import JSONResponse
from mla_switchboard.core.schemas import NO_NUL, RulesDocument, error_responses
from mla_switchboard.service.api.changes import committed, preview_change
from mla_switchboard.service.api.deps import AdminDep, RuntimeDep, ViewerDep, fail
from mla_switchboard.service.api.etags import etag_matches
from mla_switchboard.service.auth import OutOfScope, Principal
from mla_switchboard.service.state import rules_etag

router = APIRouter(prefix="/v1/rules", tags=["rules"], responses=error_responses(401, 403))


@router.get(
    "",
    response_model=RulesDocument,
    responses={304: {"description": "If-None-Match matched"}},
    summary="The priority rules in force, with their revision",
)
def get_rules(
    runtime: RuntimeDep,
    principal: ViewerDep,
    response: Response,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response | RulesDocument:
    rules = runtime.snapshot.rules
    etag = rules_etag(rules.revision or 0)
    if etag_matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    response.headers["ETag"] = etag
    if principal.restricted:
        # the fleet lists and this token's clusters' rule sets; a scoped admin's PUT
        # of this document changes only those (see put_rules)
        visible = {c: r for c, r in rules.clusters.items() if principal.may_see(c)}
        return rules.model_copy(update={"clusters": visible})
    return rules


def scoped_merge(
    principal: Principal, document: RulesDocument
) -> Callable[[RulesDocument], RulesDocument]:
    """What a PUT of ``document`` by ``principal`` makes of the rules stored now.

    An unrestricted admin replaces the document. A token limited to some clusters
    changes only the rule sets of its clusters: the stored rule sets of every other
    cluster are kept whatever the document says of them (it sees only its own in GET),
    and the fleet lists must be the stored ones. Applied by the store to the revision
    it holds, inside the write's transaction, so a replica's stale copy can never
    carry an old fleet list (or another cluster's rule set) back in (issue 13).
    """

    def merge(current: RulesDocument) -> RulesDocument:
        if not principal.restricted:
            return document
        if current.default != document.default or current.by_capability != document.by_capability:
            raise OutOfScope(
                f"token {principal.name!r} is limited to clusters; the fleet lists (default, "
                "by_capability) need an unrestricted admin token"
            )
        outside = sorted(c for c in document.clusters if not principal.may_touch(c))
        if outside:
            scope = ", ".join(principal.clusters or ())
            raise OutOfScope(
                f"token {principal.name!r} is limited to clusters {scope}; not {outside[0]!r}"
            )
        kept = {c: r for c, r in current.clusters.items() if not principal.may_touch(c)}
        return document.model_copy(update={"clusters": {**kept, **document.clusters}})

    return merge


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
    if_match: Annotated[
        str | None,
        Header(description="ETag from GET; stale -> 412 (so is a stale revision in the body)"),
    ] = None,
    note: Annotated[
        str | None, Query(max_length=2000, pattern=NO_NUL, description="why, for the audit log")
    ] = None,
) -> Response:
    if if_match is None and document.revision is not None:
        # the document says which revision it was read from: a stale one is a 412, as
        # with If-Match (a replica that had not seen another admin's change handed it
        # out, and writing it back would revert that change)
        if_match = rules_etag(document.revision)
    merge = scoped_merge(principal, document)
    try:
        proposed = merge(runtime.snapshot.rules)
    except OutOfScope:
        runtime.live.reload()  # this replica's copy may be behind the store's
        try:
            proposed = merge(runtime.snapshot.rules)
        except OutOfScope as exc:
            fail(403, str(exc))
    preview = preview_change(runtime, rules=proposed)
    if dry_run:
        return JSONResponse({"dry_run": True, "preview": preview.model_dump()})
    try:
        result = runtime.store.put_rules(
            proposed,
            actor=principal.name,
            if_match=if_match,
            note=note,
            preview={k: v for k, v in preview.model_dump().items() if k != "invalid"},
            merge=merge,
        )
    except OutOfScope as exc:
        fail(403, str(exc))
    stored = committed(runtime, result, "rules")
    return JSONResponse(
        {"rules": stored.model_dump(mode="json"), "preview": preview.model_dump()},
        headers={"ETag": rules_etag(stored.revision or 0)},
    )
