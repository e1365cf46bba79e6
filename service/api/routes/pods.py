"""``GET /v1/pods``: the live fleet, one row per pod, paged by the server.

Every pod whose newest decision is recent (``SWITCHBOARD_POD_TTL_DAYS``), filtered in
the database by cluster, backend, source and stage bucket and, through the request
shapes in the fleet's counts, by engine, GPU and model; a page is an index range scan
of at most ``limit`` rows whatever the fleet's size, continued with an opaque cursor.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from mla_switchboard.core.engine_names import OWN_ENGINE
from mla_switchboard.core.evaluator import applicable_overrides
from mla_switchboard.core.names import cluster_matches
from mla_switchboard.core.schemas import (
    CLUSTER_PATTERN,
    NO_NUL,
    OVERRIDE_SCOPE_PATTERN,
    BackendName,
    EngineName,
    Override,
    SelectRequest,
    Source,
    error_responses,
)
from mla_switchboard.core.stages import bucket_in_stage, stage_buckets
from mla_switchboard.service.api.deps import RuntimeDep, ViewerDep
from mla_switchboard.service.api.etags import conditional, etag_matches
from mla_switchboard.service.auth import Principal
from mla_switchboard.service.fleet.groups import PodGroup
from mla_switchboard.service.runtime import Runtime
from mla_switchboard.service.store.fleet import PodFilter
from mla_switchboard.service.store.rows import FleetGroup, LivePod
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


@router.get(
    "/pods",
    response_model=PodPage,
    summary="The live fleet: every pod's newest decision",
    responses={304: {"description": "If-None-Match matched: this page did not change"}},
)
def list_pods(
    runtime: RuntimeDep,
    principal: ViewerDep,
    cluster: ClusterQ = None,
    backend: BackendName | None = None,
    source: Source | None = None,
    engine: EngineName | None = None,
    gpu: GpuQ = None,
    stage: StageQ = None,
    q: Annotated[
        str | None,
        Query(min_length=1, max_length=253, pattern=NO_NUL, description="pod or node name prefix"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Cursor = None,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """One page of the caller's live fleet, filtered in the store. The ETag is the
    page's content: a console polling a page that did not change gets a 304."""
    after = _cursor(cursor)
    if runtime.recorder.pending:  # the caller's own pods: written by the next batch
        runtime.recorder.flush(wake=False)
    fleet = runtime.fleet.current()
    shapes = {g.shape_id: g.request for g in fleet.groups}
    where = _where(
        runtime, principal, shapes, cluster, backend, source, engine, gpu, stage, prefix=q
    )
    if where is None:
        return conditional({"items": [], "next_cursor": None}, if_none_match)
    rows = runtime.store.fleet.list_pods(where, after=after, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    now = datetime.now(UTC)
    overrides = runtime.inputs.overrides
    items = [_item(p, shapes.get(p.shape_id or ""), overrides, now) for p in rows]
    last = rows[-1] if rows else None
    next_cursor = None if not more or last is None else _encode((last.cluster, last.node, last.pod))
    page = {"items": items, "next_cursor": next_cursor}
    return conditional(jsonable_encoder(page), if_none_match)


@router.get(
    "/pods/facets",
    summary="What the live fleet can be filtered by, and how many pods a filter keeps",
    responses={304: {"description": "If-None-Match matched: nothing changed"}},
)
def pod_facets(
    runtime: RuntimeDep,
    principal: ViewerDep,
    cluster: ClusterQ = None,
    backend: BackendName | None = None,
    source: Source | None = None,
    engine: EngineName | None = None,
    gpu: GpuQ = None,
    stage: StageQ = None,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Every value of each ``GET /v1/pods`` filter in the caller's live fleet, with the
    pods it would keep together with the *other* filters given (a faceted search: with
    ``cluster=east`` the engines count east's pods, and the clusters still count every
    cluster, so another can be picked), and ``pods``: how many pods these filters keep
    (``q`` aside), so that a console can fill its filter lists and say "1-100 of 3,412".
    Read from the fleet's counts: O(groups x filters), whatever the number of pods."""
    if runtime.recorder.pending:
        runtime.recorder.flush(wake=False)
    fleet = runtime.fleet.current()
    params = (principal.clusters, cluster, backend, source, engine, gpu, stage)
    etag = f'"facets-{fleet.version}-{runtime.snapshot.version}-{_digest(params)}"'
    if etag_matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    shapes = {g.shape_id: g.request for g in fleet.groups}
    given = {"cluster": cluster, "backend": backend, "source": source, "engine": engine,
             "gpu": gpu}  # fmt: skip

    def where_but(facet: str | None) -> PodFilter | None:
        f = {**given, **({} if facet is None else {facet: None})}
        return _where(runtime, principal, shapes, stage=stage, **f)

    every = where_but(None)
    # a facet's own filter is left out of its counts; one not given changes nothing
    wheres = {name: where_but(name) if given[name] is not None else every for name in given}
    facets: dict[str, Counter[str]] = {f"{k}s": Counter() for k in given}
    kept = 0
    for group in fleet.groups:
        if not principal.may_see(group.cluster):
            continue
        request = group.request
        for row in group.rows:
            if row.pods <= 0:
                continue
            values = {
                "cluster": group.cluster,
                "backend": row.backend,
                "source": row.source,
                "engine": None
                if request is None
                else (request.engine.name if request.engine else OWN_ENGINE),
                "gpu": None if request is None else request.device.name or None,
            }
            for name, value in values.items():
                if value is None:
                    continue
                where = wheres[name]
                facets[f"{name}s"][value] += 0 if where is None else _kept(group, row, where)
            kept += 0 if every is None else _kept(group, row, every)
    body: dict[str, Any] = {
        name: [{"name": k, "pods": n} for k, n in sorted(counts.items())]
        for name, counts in facets.items()
    }
    body["pods"] = kept
    return JSONResponse(body, headers={"ETag": etag})


def _where(
    runtime: Runtime,
    principal: Principal,
    shapes: dict[str, SelectRequest | None],
    cluster: str | None,
    backend: BackendName | None,
    source: str | None,
    engine: EngineName | None,
    gpu: str | None,
    stage: str | None,
    prefix: str | None = None,
) -> PodFilter | None:
    """The store's filter for these parameters; None when no pod can match."""
    globs = _scope(principal, cluster)
    if globs == ():
        return None
    rollout = _rollout(runtime, stage)
    if stage is not None and rollout is None:
        return None  # no active staged rollout there
    if rollout is not None and rollout.cluster != "*":
        globs = (rollout.cluster,) if globs is None or _covers(globs, rollout.cluster) else ()
        if globs == ():
            return None
    wanted = _shapes(shapes, engine, gpu, rollout)
    if wanted == ():
        return None
    return PodFilter(
        cluster_globs=globs,
        backends=None if backend is None else (backend.value,),
        sources=None if source is None else (source,),
        shape_ids=wanted,
        buckets=None
        if rollout is None or rollout.rollout is None
        else tuple(sorted(stage_buckets(rollout.rollout))),
        prefix=prefix,
    )


def _kept(group: PodGroup, row: FleetGroup, where: PodFilter) -> int:
    """How many pods of one fleet-count row ``where`` keeps: the same conditions
    ``list_pods`` gives the database, on the counts (``prefix`` aside)."""
    if where.cluster_globs is not None and not _covers(where.cluster_globs, group.cluster):
        return 0
    if where.shape_ids is not None and group.shape_id not in where.shape_ids:
        return 0
    if where.backends is not None and row.backend not in where.backends:
        return 0
    if where.sources is not None and row.source not in where.sources:
        return 0
    if where.buckets is None:
        return row.pods
    return sum(row.buckets[b] for b in where.buckets if b < len(row.buckets))


def _digest(params: tuple[Any, ...]) -> str:
    return hashlib.sha256(repr(params).encode()).hexdigest()[:16]


def _scope(principal: Principal, cluster: str | None) -> tuple[str, ...] | None:
    """The cluster globs to list: the asked cluster within the token's scope, else the
    token's scope (None: every cluster); ``()``: nothing the caller may see."""
    if cluster is not None:
        return (cluster,) if principal.may_see(cluster) else ()
    return principal.clusters if principal.restricted else None


def _covers(globs: tuple[str, ...], cluster: str) -> bool:
    return cluster_matches(cluster, globs)


def _rollout(runtime: Runtime, scope: str | None) -> Override | None:
    if scope is None:
        return None
    o = next((o for o in runtime.inputs.overrides if o.cluster == scope), None)
    r = None if o is None else o.rollout
    return o if r is not None and r.state == "active" and r.percent < 100 else None


def _shapes(
    shapes: dict[str, SelectRequest | None],
    engine: EngineName | None,
    gpu: str | None,
    rollout: Override | None,
) -> tuple[str, ...] | None:
    """The shapes a filter on what pods sent keeps (None: no such filter)."""
    if engine is None and gpu is None and (rollout is None or rollout.model is None):
        return None
    kept = []
    for shape_id, request in shapes.items():
        if request is None:
            continue
        if engine is not None and (request.engine.name if request.engine else OWN_ENGINE) != (
            engine
        ):
            continue
        if gpu is not None and request.device.name != gpu:
            continue
        model = rollout.model if rollout is not None else None
        if model is not None and not fnmatch.fnmatchcase(request.model.name or "", model):
            continue
        kept.append(shape_id)
    return tuple(sorted(kept))


def _item(
    p: LivePod, request: SelectRequest | None, overrides: tuple[Override, ...], now: datetime
) -> dict[str, Any]:
    staged: list[str] = []
    if request is not None:
        named = request.model_copy(update={"cluster": p.cluster, "pod": p.pod})
        for o in applicable_overrides(named, overrides, now):
            r = o.rollout
            if r is not None and r.state == "active" and bucket_in_stage(p.bucket, r):
                staged.append(o.cluster)
    return {
        "cluster": p.cluster,
        "node": p.node,
        "pod": p.pod,
        "decision_id": p.decision_id,
        "backend": p.backend,
        "source": p.source,
        "last_seen": p.seen_at,
        "device": {} if request is None else request.device.model_dump(mode="json"),
        "model": None if request is None else request.model.name,
        "engine": None
        if request is None or request.engine is None
        else request.engine.model_dump(mode="json"),
        "in_stage": staged,
    }


def _encode(key: tuple[str, str, str]) -> str:
    return base64.urlsafe_b64encode("\t".join(key).encode()).decode()


def _cursor(cursor: str | None) -> tuple[str, str, str] | None:
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
    runtime: RuntimeDep,
    principal: ViewerDep,
    hours: Annotated[int, Query(ge=1, le=168, description="how far back (hours)")] = 1,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Pods whose agent sent no token, an unknown or revoked one, one without the agent
    role, or one limited to other clusters: each such pod still boots (its agent
    decides locally), so this is where a fleet with a wrong secret shows. Counted by
    every replica, per claimed cluster: clusters the service knows by name, other names
    by name within a small budget an hour, then as "(unknown cluster)" (see
    ``service/refused.py``)."""
    since = datetime.now(UTC) - timedelta(hours=hours)
    items = [
        {"cluster": r.cluster, "reason": r.reason, "count": r.refused, "last_at": r.last_at}
        for r in runtime.refused_selects.recent(since)
        if principal.may_see(r.cluster)
    ]
    return conditional(jsonable_encoder({"hours": hours, "items": items}), if_none_match)
