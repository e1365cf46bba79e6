"""The live fleet, one row per pod, and what it can be filtered by.

Every pod whose newest decision is recent (``SWITCHBOARD_POD_TTL_DAYS``), filtered in
the database by cluster, backend, source and stage bucket and, through the request
shapes in the fleet's counts, by engine, GPU and model; a page is an index range scan
of at most ``limit`` rows whatever the fleet's size. The facet counts apply the same
filter (``PodFilter.pods_in``) to the fleet's counts by group.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core.evaluator import DecisionInputs, applicable_overrides
from mla_switchboard.core.names import cluster_matches, model_matches
from mla_switchboard.core.schemas import Override, SelectRequest
from mla_switchboard.core.stages import bucket_in_stage, stage_buckets
from mla_switchboard.service.fleet.groups import Fleet, FleetSnapshot
from mla_switchboard.service.identity.auth import Principal
from mla_switchboard.service.live.poller import LiveConfig
from mla_switchboard.service.store.fleet import FleetStore, PodFilter
from mla_switchboard.service.store.recorder import DecisionRecorder
from mla_switchboard.service.store.rows import LivePod

Position = tuple[str, str, str]
"""(cluster, node, pod): where a page starts, after it."""

FACETS = ("cluster", "backend", "source", "engine", "gpu")
"""The filters the facet counts are given per value of."""


@dataclass(frozen=True)
class PodQuery:
    """What ``GET /v1/pods`` and its facets are filtered by (None: no condition);
    ``stage``: only pods in the stage of this scope's active rollout."""

    cluster: str | None = None
    backend: str | None = None
    source: str | None = None
    engine: str | None = None
    gpu: str | None = None
    stage: str | None = None
    prefix: str | None = None  # of the pod's or the node's name (pages only)


@dataclass(eq=False)
class PodReads:
    """``inputs``: the decision inputs in force (their overrides: who is staged)."""

    fleet: Fleet
    recorder: DecisionRecorder
    counts: FleetStore
    live: LiveConfig
    inputs: Callable[[], DecisionInputs]

    def _current(self) -> FleetSnapshot:
        """The fleet with the caller's own pods in it: they are written by the writer's
        next batch, which this waits for rather than wakes."""
        if self.recorder.pending:
            self.recorder.settle_for_read(wake=False)
        return self.fleet.current()

    def page(
        self, principal: Principal, query: PodQuery, *, after: Position | None, limit: int
    ) -> tuple[list[dict[str, Any]], Position | None]:
        """One page of the caller's live fleet and where the next starts (None: last)."""
        fleet = self._current()
        shapes = {g.shape_id: g.request for g in fleet.groups}
        overrides = self.inputs().overrides
        where = pod_filter(principal, query, shapes, overrides)
        if where is None:
            return [], None
        rows = self.counts.list_pods(where, after=after, limit=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        now = datetime.now(UTC)
        items = [_item(p, shapes.get(p.shape_id or ""), overrides, now) for p in rows]
        last = rows[-1] if rows else None
        return items, None if not more or last is None else (last.cluster, last.node, last.pod)

    def facets(
        self, principal: Principal, query: PodQuery, unless: Callable[[str], bool]
    ) -> tuple[str, dict[str, Any] | None]:
        """The ETag of the facets for ``query`` and, unless ``unless(etag)`` (the
        caller has them already), the facets: every value of each filter in the
        caller's live fleet with the pods it keeps together with the *other* filters
        given, and ``pods``: how many pods the filters keep (``prefix`` aside). Read
        from the fleet's counts: O(groups x filters), whatever the number of pods."""
        fleet = self._current()
        params = (principal.clusters, *(getattr(query, f) for f in FACETS), query.stage)
        etag = f'"facets-{fleet.version}-{self.live.current().version}-{_digest(params)}"'
        if unless(etag):
            return etag, None
        shapes = {g.shape_id: g.request for g in fleet.groups}
        overrides = self.inputs().overrides

        def where_but(facet: str | None) -> PodFilter | None:
            loose = query if facet is None else replace(query, **{facet: None})
            return pod_filter(principal, replace(loose, prefix=None), shapes, overrides)

        every = where_but(None)
        # a facet's own filter is left out of its counts; one not given changes nothing
        given = asdict(query)
        wheres = {f: where_but(f) if given[f] is not None else every for f in FACETS}
        facets: dict[str, Counter[str]] = {f"{f}s": Counter() for f in FACETS}
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
                    "engine": None if request is None else request.engine_name,
                    "gpu": None if request is None else request.device.name or None,
                }
                for name, value in values.items():
                    where = wheres[name]
                    if value is not None:
                        facets[f"{name}s"][value] += 0 if where is None else where.pods_in(row)
                kept += 0 if every is None else every.pods_in(row)
        body: dict[str, Any] = {
            name: [{"name": k, "pods": n} for k, n in sorted(counts.items())]
            for name, counts in facets.items()
        }
        body["pods"] = kept
        return etag, body


def pod_filter(
    principal: Principal,
    query: PodQuery,
    shapes: dict[str, SelectRequest | None],
    overrides: tuple[Override, ...],
) -> PodFilter | None:
    """The one filter of ``query`` for this caller, which both the store's page and
    the facet counts apply; None when no pod can match."""
    globs = _scope(principal, query.cluster)
    if globs == ():
        return None
    rollout = _rollout(overrides, query.stage)
    if query.stage is not None and rollout is None:
        return None  # no active staged rollout there
    if rollout is not None and rollout.cluster != "*":
        covered = globs is None or cluster_matches(rollout.cluster, globs)
        globs = (rollout.cluster,) if covered else ()
        if globs == ():
            return None
    wanted = _shapes(shapes, query.engine, query.gpu, rollout)
    if wanted == ():
        return None
    return PodFilter(
        cluster_globs=globs,
        backends=None if query.backend is None else (query.backend,),
        sources=None if query.source is None else (query.source,),
        shape_ids=wanted,
        buckets=None
        if rollout is None or rollout.rollout is None
        else tuple(sorted(stage_buckets(rollout.rollout))),
        prefix=query.prefix,
    )


def _digest(params: tuple[Any, ...]) -> str:
    return hashlib.sha256(repr(params).encode()).hexdigest()[:16]


def _scope(principal: Principal, cluster: str | None) -> tuple[str, ...] | None:
    """The cluster globs to list: the asked cluster within the token's scope, else the
    token's scope (None: every cluster); ``()``: nothing the caller may see."""
    if cluster is not None:
        return (cluster,) if principal.may_see(cluster) else ()
    return principal.clusters if principal.restricted else None


def _rollout(overrides: tuple[Override, ...], scope: str | None) -> Override | None:
    if scope is None:
        return None
    o = next((o for o in overrides if o.cluster == scope), None)
    r = None if o is None else o.rollout
    return o if r is not None and r.state == "active" and r.percent < 100 else None


def _shapes(
    shapes: dict[str, SelectRequest | None],
    engine: str | None,
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
        if engine is not None and request.engine_name != engine:
            continue
        if gpu is not None and request.device.name != gpu:
            continue
        model = rollout.model if rollout is not None else None
        if not model_matches(request.model.name, model):
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
