"""``GET /v1/backends``: the backend registry, for the dashboard and any other client.

The dashboard builds its backend list, order and colours from this answer, so it
spells no backend itself: a backend added to ``core/specs.py`` shows up there with
its own colour and nothing else to edit. It needs a viewer token like every other
read of the API (only the probes and metrics are open). The document changes only
with a release, so it is built once and a poll with its ETag costs a 304.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from mla_switchboard.core.schemas import BackendsDocument, backends_document, error_responses
from mla_switchboard.service.api.deps import ViewerDep
from mla_switchboard.service.api.etags import conditional
from mla_switchboard.service.api.params import IfNoneMatch

router = APIRouter(prefix="/v1/backends", tags=["backends"], responses=error_responses(401, 403))

DOCUMENT = backends_document().model_dump(mode="json")


@router.get(
    "",
    response_model=BackendsDocument,
    responses={304: {"description": "If-None-Match matched"}},
    summary="Every backend: what it runs on, the packages it needs, its display order and colour",
)
def get_backends(principal: ViewerDep, if_none_match: IfNoneMatch = None) -> Response:
    return conditional(DOCUMENT, if_none_match)
