"""``/v1/rules``: the priority lists, read by anyone with a viewer token."""

from __future__ import annotations

from fastapi import APIRouter, Response
from mla_switchboard.core.schemas import RulesDocument, error_responses
from mla_switchboard.service.api.deps import AdminDep, RulesWritesDep, SnapshotDep, ViewerDep
from mla_switchboard.service.api.etags import etag_matches
from mla_switchboard.service.api.outcomes import respond
from mla_switchboard.service.api.params import AuditNote, IfNoneMatch, WriteControlsDep
from mla_switchboard.service.state import rules_etag

router = APIRouter(prefix="/v1/rules", tags=["rules"], responses=error_responses(401, 403))


@router.get(
    "",
    response_model=RulesDocument,
    responses={304: {"description": "If-None-Match matched"}},
    summary="The priority rules in force, with their revision",
)
def get_rules(
    snapshot: SnapshotDep,
    principal: ViewerDep,
    response: Response,
    if_none_match: IfNoneMatch = None,
) -> Response | RulesDocument:
    rules = snapshot.rules
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


@router.put(
    "",
    summary="Replace the priority rules (accepts what GET returns)",
    responses=error_responses(409, 412, 413, 503),
)
def put_rules(
    document: RulesDocument,
    writes: RulesWritesDep,
    principal: AdminDep,
    control: WriteControlsDep,
    note: AuditNote = None,
) -> Response:
    """A stale ``revision`` in the body is refused with 412, as a stale If-Match is."""
    if_match = control.if_match
    key = control.key("PUT rules", document.model_dump(mode="json"), if_match, note)
    return respond(
        writes.put_rules(
            principal, document, if_match=if_match, dry_run=control.dry_run, note=note, key=key
        )
    )
