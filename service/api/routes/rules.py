"""``/v1/rules``: the priority lists, read by anyone with a viewer token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Response

from service.api.deps import RuntimeDep, ViewerDep
from service.schemas import RulesDocument
from service.store.repo import rules_etag

router = APIRouter(prefix="/v1/rules", tags=["rules"])


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
