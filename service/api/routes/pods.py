"""``GET /v1/pods``: the live fleet, one row per pod, paged by the server and
continued with an opaque cursor; its facets; refused selects. What is read is
``service/reads/pods.py``'s: these routes parse, call it and format.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from mla_switchboard.core.schemas import (
    CLUSTER_PATTERN,
    NO_NUL,
    OVERRIDE_SCOPE_PATTERN,
    BackendName,
    EngineName,
    Source,
    error_responses,
)
from mla_switchboard.service.api.deps import PodsDep, RefusedDep, ViewerDep
from mla_switchboard.service.api.etags import conditional, etag_matches
from mla_switchboard.service.api.params import IfNoneMatch
from mla_switchboard.service.reads.pods import PodQuery, Position
from pydantic import BaseModel

router = APIRouter(prefix="/v1", tags=["selections"], responses=error_responses(401, 403))


class PodItem(BaseModel):
    cluster: str
    node: str
    pod: str
    decision_id: str
    backend: str
    source: str
    last_seen: datetime
    device: dict[str, Any]
    model: str | None
    engine: dict[str, Any] | None
    in_stage: list[str]


class PodPage(BaseModel):
    items: list[PodItem]
    next_cursor: str | None


Cursor = Annotated[
    str | None,
    Query(
        max_length=1400,
        pattern=r"^[A-Za-z0-9_-]+={0,2}$",
        description="next_cursor of the previous page",
    ),
]


ClusterQ = Annotated[str | None, Query(pattern=CLUSTER_PATTERN, max_length=63)]
GpuQ = Annotated[
    str | None,
    Query(min_length=1, max_length=253, pattern=NO_NUL, description="GPU name, exact"),
]
StageQ = Annotated[
    str | None,
    Query(
        pattern=OVERRIDE_SCOPE_PATTERN,
        max_length=63,
        description="only pods in the stage of this scope's active rollout (a cluster or *)",
    ),
]


@dataclass
class PodFilterParams:
    """The filters ``GET /v1/pods`` and its facets share, as one FastAPI dependency:
    both routes take the same query parameters, checked the same way."""

    cluster: ClusterQ = None
    backend: BackendName | None = None
    source: Source | None = None
    engine: EngineName | None = None
    gpu: GpuQ = None
    stage: StageQ = None

    def query(self, prefix: str | None = None) -> PodQuery:
        return PodQuery(
            cluster=self.cluster,
            backend=None if self.backend is None else self.backend.value,
            source=self.source,
            engine=self.engine,
            gpu=self.gpu,
            stage=self.stage,
            prefix=prefix,
        )


@router.get(
    "/pods",
    response_model=PodPage,
    summary="The live fleet: every pod's newest decision",
    responses={304: {"description": "If-None-Match matched: this page did not change"}},
)
def list_pods(
    pods: PodsDep,
    principal: ViewerDep,
    where: Annotated[PodFilterParams, Depends()],
    q: Annotated[
        str | None,
        Query(min_length=1, max_length=253, pattern=NO_NUL, description="pod or node name prefix"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Cursor = None,
    if_none_match: IfNoneMatch = None,
) -> Response:
    """One page of the caller's live fleet, filtered in the store. The ETag is the
    page's content: a console polling a page that did not change gets a 304."""
    items, last = pods.page(principal, where.query(prefix=q), after=_cursor(cursor), limit=limit)
    page = {"items": items, "next_cursor": None if last is None else _encode(last)}
    return conditional(jsonable_encoder(page), if_none_match)


@router.get(
    "/pods/facets",
    summary="What the live fleet can be filtered by, and how many pods a filter keeps",
    responses={304: {"description": "If-None-Match matched: nothing changed"}},
)
def pod_facets(
    pods: PodsDep,
    principal: ViewerDep,
    where: Annotated[PodFilterParams, Depends()],
    if_none_match: IfNoneMatch = None,
) -> Response:
    """Every value of each ``GET /v1/pods`` filter in the caller's live fleet, with the
    pods it would keep together with the *other* filters given (a faceted search: with
    ``cluster=east`` the engines count east's pods, and the clusters still count every
    cluster, so another can be picked), and ``pods``: how many pods these filters keep
    (``q`` aside), so that a console can fill its filter lists and say "1-100 of 3,412".
    Read from the fleet's counts: O(groups x filters), whatever the number of pods."""
    etag, body = pods.facets(principal, where.query(), lambda e: etag_matches(if_none_match, e))
    if body is None:
        return Response(status_code=304, headers={"ETag": etag})
    return JSONResponse(body, headers={"ETag": etag})


def _encode(key: Position) -> str:
    return base64.urlsafe_b64encode("\t".join(key).encode()).decode()


def _cursor(cursor: str | None) -> Position | None:
    """The position a cursor names: the (cluster, node, pod) after which the page starts.
    Every value the parameter's pattern admits decodes to *some* position, so a cursor
    edited by hand pages from somewhere rather than failing."""
    if cursor is None:
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode(
            "utf-8", errors="replace"
        )
    except ValueError:  # not base64 after all: the text itself is the position
        text = cursor
    parts = text.replace("\x00", "").split("\t", 2)
    parts += [""] * (3 - len(parts))
    return (parts[0], parts[1], parts[2])


class RefusedItem(BaseModel):
    cluster: str
    reason: str
    count: int
    last_at: datetime


class RefusedPage(BaseModel):
    hours: int
    items: list[RefusedItem]


@router.get(
    "/refusals",
    response_model=RefusedPage,
    summary="Selects refused for their token, per claimed cluster: misconfigured pods",
    responses={304: {"description": "If-None-Match matched: nothing changed"}},
)
def refusals(
    refused: RefusedDep,
    principal: ViewerDep,
    hours: Annotated[int, Query(ge=1, le=168, description="how far back (hours)")] = 1,
    if_none_match: IfNoneMatch = None,
) -> Response:
    """Pods whose agent sent no token, an unknown or revoked one, one without the agent
    role, or one limited to other clusters: each such pod still boots (its agent
    decides locally), so this is where a fleet with a wrong secret shows. Counted by
    every replica, per claimed cluster: clusters the service knows by name, other names
    by name within a small budget an hour, then as "(unknown cluster)" (see
    ``service/refused.py``)."""
    since = datetime.now(UTC) - timedelta(hours=hours)
    items = [
        {"cluster": c, "reason": r, "count": n, "last_at": last}
        for c, r, n, last in refused.recent(since)
        if principal.may_see(c)
    ]
    return conditional(jsonable_encoder({"hours": hours, "items": items}), if_none_match)
