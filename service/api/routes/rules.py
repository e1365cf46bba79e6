"""``/v1/rules``: the priority lists, read by anyone with a viewer token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from mla_switchboard.core.schemas import NO_NUL, RulesDocument, error_responses
from mla_switchboard.service.api.deps import AdminDep, RulesWritesDep, SnapshotDep, ViewerDep
from mla_switchboard.service.api.etags import etag_matches
from mla_switchboard.service.api.outcomes import IdempotencyKeyHeader, respond
from mla_switchboard.service.state import rules_etag
from mla_switchboard.service.writes import IdempotencyKey

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
    if_none_match: Annotated[str | None, Header()] = None,
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
    responses=error_responses(412, 413, 503),
)
def put_rules(
    document: RulesDocument,
    writes: RulesWritesDep,
    principal: AdminDep,
    dry_run: Annotated[bool, Query(description="answer the preview, change nothing")] = False,
    if_match: Annotated[
        str | None,
        Header(description="ETag from GET; stale -> 412 (so is a stale revision in the body)"),
    ] = None,
    note: Annotated[
        str | None, Query(max_length=2000, pattern=NO_NUL, description="why, for the audit log")
    ] = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    key = IdempotencyKey.of(
        idempotency_key, "PUT rules", document.model_dump(mode="json"), if_match, note
    )
    return respond(
        writes.put_rules(
            principal, document, if_match=if_match, dry_run=dry_run, note=note, key=key
        )
    )
