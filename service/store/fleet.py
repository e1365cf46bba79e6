"""Fleet reads: the counts per group, the live pods page by page, shapes by id.

Everything here reads what ``DecisionStore``'s batches keep (``fleet_counts``,
``pod_latest``, ``shapes``), so each read costs O(groups) or one index range scan,
however many pods there are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mla_switchboard.core.names import cluster_matches
from mla_switchboard.service.store.base import aware
from mla_switchboard.service.store.models import FleetCount, Meta, PodLatest, ShapeRow
from mla_switchboard.service.store.rows import FleetGroup, GroupCounts, LivePod, columns
from sqlalchemy import Engine, func, or_, select, tuple_
from sqlalchemy.orm import Session


@dataclass(frozen=True)
class PodFilter:
    """What ``list_pods`` selects; every field narrows (None: no condition). Cluster
    globs use the token rule (``*`` and ``?`` over [a-z0-9._-]), so a token's scope is
    a filter the database applies, not a scan."""

    cluster_globs: tuple[str, ...] | None = None
    backends: tuple[str, ...] | None = None
    sources: tuple[str, ...] | None = None
    shape_ids: tuple[str, ...] | None = None
    buckets: tuple[int, ...] | None = None
    prefix: str | None = None  # of the pod's or the node's name

    def pods_in(self, row: FleetGroup) -> int:
        """How many pods of one fleet-count row this filter keeps: the conditions
        ``list_pods`` gives the database (``_filtered``), on the counts (``prefix``
        aside), so that a page and the facet counts beside it can never disagree."""
        if self.cluster_globs is not None and not cluster_matches(row.cluster, self.cluster_globs):
            return 0
        if self.shape_ids is not None and row.shape_id not in self.shape_ids:
            return 0
        if self.backends is not None and row.backend not in self.backends:
            return 0
        if self.sources is not None and row.source not in self.sources:
            return 0
        if self.buckets is None:
            return row.pods
        return sum(row.buckets[b] for b in self.buckets if b < len(row.buckets))


class FleetStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._shapes: dict[str, str] = {}  # id -> JSON, read back once (immutable)
        # each group's row as last read, with the text its buckets were parsed from
        self._rows: dict[tuple[str, str, str, str], tuple[int, str, FleetGroup]] = {}

    def summary(self) -> dict[str, dict[str, int]]:
        """Pods per cluster and backend (each named pod's newest decision)."""
        pods = func.sum(FleetCount.pods).label("pods")
        q = select(FleetCount.cluster, FleetCount.backend, pods).group_by(
            FleetCount.cluster, FleetCount.backend
        )
        out: dict[str, dict[str, int]] = {}
        with Session(self.engine) as s:
            for row in s.execute(q):
                if row.pods:
                    out.setdefault(row.cluster, {})[row.backend] = int(row.pods)
        return {c: dict(sorted(b.items())) for c, b in sorted(out.items())}

    def fleet_version(self) -> int:
        with Session(self.engine) as s:
            return s.scalar(select(Meta.value).where(Meta.key == "fleet_version")) or 0

    def fleet_groups(self) -> tuple[int, list[FleetGroup]]:
        """Every group with its per-bucket counts, and the ``fleet_version`` they are as
        of (read in one transaction): O(clusters x shapes x backends) rows."""
        with self.engine.connect() as conn, conn.begin():
            version = conn.execute(
                select(Meta.value).where(Meta.key == "fleet_version")
            ).scalar_one_or_none()
            q = select(*columns(FleetCount, GroupCounts))
            groups = [self._row(g) for g in map(GroupCounts._make, conn.execute(q))]
        if len(self._rows) > 2 * len(groups) + 1024:  # groups that left the fleet
            live = {(g.cluster, g.shape_id, g.backend, g.source) for g in groups}
            self._rows = {k: v for k, v in self._rows.items() if k in live}
        return version or 0, groups

    def _row(self, g: GroupCounts) -> FleetGroup:
        """The group's row: the one read last time (the same object) while its counts
        are the same, so a new fleet version parses only the groups it changed, and
        readers that keep work per group (``service/fleet/``) tell them apart by
        identity."""
        key = (g.cluster, g.shape_id, g.backend, g.source)
        kept = self._rows.get(key)
        if kept is not None and kept[0] == g.pods and kept[1] == g.buckets:
            return kept[2]
        row = FleetGroup(*key, g.pods, tuple(json.loads(g.buckets)))
        self._rows[key] = (g.pods, g.buckets, row)
        return row

    def shapes(self, ids: Iterable[str]) -> dict[str, str]:
        """Shape JSON by id; shapes never change, so each is read from the store once."""
        wanted = [i for i in set(ids) if i not in self._shapes]
        if wanted:
            with self.engine.connect() as conn:
                for i in range(0, len(wanted), 500):
                    q = select(ShapeRow.id, ShapeRow.request).where(
                        ShapeRow.id.in_(wanted[i : i + 500])
                    )
                    self._shapes.update({row.id: row.request for row in conn.execute(q)})
        return {i: self._shapes[i] for i in ids if i in self._shapes}

    def list_pods(
        self, where: PodFilter, *, after: tuple[str, str, str] | None, limit: int
    ) -> list[LivePod]:
        """Live pods in (cluster, node, pod) order after the cursor ``after``: one page
        costs an index range scan of the primary key, however large the fleet."""
        p = PodLatest
        q = select(
            p.cluster, p.node, p.pod, p.decision_id, p.backend, p.source, p.created_at,
            p.shape_id, p.bucket,
        )  # fmt: skip
        q = _filtered(q, where)
        if after is not None:
            q = q.where(tuple_(p.cluster, p.node, p.pod) > tuple_(*after))
        q = q.order_by(p.cluster, p.node, p.pod).limit(limit)
        with self.engine.connect() as conn:
            return [
                LivePod(
                    r.cluster, r.node, r.pod, r.decision_id, r.backend, r.source,
                    aware(r.created_at), r.shape_id, r.bucket,
                )
                for r in conn.execute(q)
            ]  # fmt: skip


def _filtered(q: Any, where: PodFilter) -> Any:
    p = PodLatest
    if where.cluster_globs is not None:
        q = q.where(or_(*(_glob(p.cluster, g) for g in where.cluster_globs)))
    if where.backends is not None:
        q = q.where(p.backend.in_(where.backends))
    if where.sources is not None:
        q = q.where(p.source.in_(where.sources))
    if where.shape_ids is not None:
        q = q.where(p.shape_id.in_(where.shape_ids))
    if where.buckets is not None:
        q = q.where(p.bucket.in_(where.buckets))
    if where.prefix:
        start = _like_escape(where.prefix) + "%"
        q = q.where(or_(p.pod.like(start, escape="\\"), p.node.like(start, escape="\\")))
    return q


def _glob(column: Any, glob: str) -> Any:
    """A cluster glob (``*``, ``?`` over [a-z0-9._-]) as SQL LIKE."""
    if not any(ch in glob for ch in "*?"):
        return column == glob
    pattern = _like_escape(glob).replace("*", "%").replace("?", "_")
    return column.like(pattern, escape="\\")


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
