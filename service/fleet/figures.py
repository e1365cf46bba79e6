"""The fleet summary's figures of each cluster, read through one ``PartsRead``: its
pods per backend, its regret and measured exclusions, and its share of each staged
override's progress.

Each is kept in the cluster's part while its key holds, carried by content to the next
configuration of the same content (``parts._Carried``), and worked out only where
neither holds it: the regret and the exclusions over the groups their evidence can
speak to (``parts.Telling``), a rollout's progress recounted from the backends a
preview carried when its groups, partial rollouts and evidence are as they were
(``progress.Counted``). What the configuration in force gives each group (a preview's
"from") stays with ``PartsRead``: both sides share it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from mla_switchboard.core.causes import MeasuredExclusion
from mla_switchboard.core.schemas import Override
from mla_switchboard.service.fleet.groups import PodGroup, StageClass
from mla_switchboard.service.fleet.parts import CARRIED_KEPT, PartsRead, Telling
from mla_switchboard.service.fleet.progress import Counted, RolloutTally
from mla_switchboard.service.fleet.regret import cluster_exclusions, cluster_regret

T = TypeVar("T")

__all__ = ["SummaryFigures"]


class SummaryFigures:
    """The summary's figures of one read (``FleetReads._summary``), cluster by cluster."""

    def __init__(self, read: PartsRead) -> None:
        self.read = read
        self._telling_found: dict[str, Telling] = {}  # per cluster: ``_telling``

    def counts(self, cluster: str) -> dict[str, int]:
        """Pods per backend they run now."""
        part = self.read.part(cluster)
        if part.counts is None:
            counts: dict[str, int] = {}
            for g in self.read.fleet.of_cluster(cluster):
                for row in g.rows:
                    counts[row.backend] = counts.get(row.backend, 0) + row.pods
            part.counts = dict(sorted(counts.items()))
        return part.counts

    def regret(self, cluster: str) -> dict[str, Any]:
        part = self.read.part(cluster)
        if part.regret is None:
            carried = self.read.carried_figures(cluster)
            if carried.regret is None:
                self.read.parts.count("regret")
                rankable = self._telling(cluster).rankable
                carried.regret = self._of_cluster(
                    cluster_regret,
                    cluster,
                    rankable=rankable,
                    valid=carried.valid,
                    pods=sum(self.counts(cluster).values()),
                )
            part.regret = carried.regret
        return part.regret

    def excluded(self, cluster: str) -> dict[str, MeasuredExclusion]:
        part = self.read.part(cluster)
        if part.excluded is None:
            carried = self.read.carried_figures(cluster)
            if carried.excluded is None:
                self.read.parts.count("excluded")
                failing = self._telling(cluster).failing  # none: nothing read
                carried.excluded = self._of_cluster(cluster_exclusions, cluster, failing=failing)
            part.excluded = carried.excluded
        return part.excluded

    def _of_cluster(self, figure: Callable[..., T], cluster: str, **telling: Any) -> T:
        """``figure`` (``cluster_regret``, ``cluster_exclusions``) over ``cluster``'s
        groups, with this read's deadline and the class cache and memo its clusters
        share; ``telling``: the groups it reads, when kept (``Telling``)."""
        read = self.read
        return figure(
            read.fleet.of_cluster(cluster),
            read.inputs,
            now=read.now,
            inputs_for=read.inputs_for,
            deadline=read.deadline,
            classes=read.classes,
            memo=read.memo,
            **telling,
        )

    def _telling(self, cluster: str) -> Telling:
        """Which of ``cluster``'s groups the regret and the exclusions read
        (``Telling``): kept per cluster while its groups, its indexes (the very
        objects) and their versions are the same, else found again from the evidence."""
        found = self._telling_found.get(cluster)
        if found is not None:
            return found
        read = self.read
        indexes = read.carry_key(cluster, read.inputs)[1]
        groups = read.fleet.of_cluster(cluster)
        key = (
            read.parts.shaped(cluster, groups)[0],
            read.inputs.evidence_generation,
            tuple(index.version for index in indexes),
        )
        kept = read.parts.telling.get(cluster)
        if kept is not None and kept.holds(key, indexes):
            self._telling_found[cluster] = kept
            return kept
        found = Telling.find(
            key, indexes, groups, read.inputs, read.now, read.inputs_for, read.memo, read.deadline
        )
        read.parts.telling[cluster] = self._telling_found[cluster] = found
        return found

    def progress(self, cluster: str, position: int, o: Override) -> RolloutTally:
        """``o``'s progress among the pods of ``cluster``; ``position``: where ``o``
        is in ``inputs.overrides_for(cluster)`` (the same in every part of one key,
        and of one carried content: ``_UNCARRIED`` leaves out no field a rollout reads)."""
        part = self.read.part(cluster)
        found = part.progress.get(position)
        if found is None:
            carried = self.read.carried_figures(cluster)
            found = carried.progress.get(position)
            if found is None:
                self.read.parts.count("progress")
                found = carried.progress[position] = self._progress_of(cluster, o)
            part.progress[position] = found
        return found

    def _progress_of(self, cluster: str, o: Override) -> RolloutTally:
        """``o``'s progress among the pods of ``cluster`` under this read's
        configuration: all but ``booted`` as kept for an earlier one when it holds
        (``progress.Counted``: the same override, groups, partial rollouts and
        evidence), ``booted`` recounted from the backends kept for this one; else the
        cluster's groups walked (and kept as that)."""
        read = self.read
        groups = read.fleet.of_cluster(cluster)
        given = read.given_kept(cluster)
        now = read.now
        # the override itself (whether it applies), then the partial rollouts (the
        # stage classes), each with whether it has expired
        staged = tuple(
            (x, x.expires_at is not None and x.expires_at <= now)
            for x in (o, *read.inputs.staged_for(cluster))
        )
        evidence = read.walk.evidence_of(cluster)
        kept = read.parts.counted.setdefault((cluster, o.cluster), [])
        if given is not None:
            for counted in kept:
                if counted.holds(o, groups, staged, evidence):
                    found = counted.recounted(given)
                    if found is not None:
                        return found
        cells: list[tuple[PodGroup, StageClass]] = []
        found = read.walk.cluster(o, groups, read.deadline, given, cells)
        kept.append(Counted(o, groups, staged, evidence, evidence.version, found, tuple(cells)))
        del kept[:-CARRIED_KEPT]  # the newest few: a scope holds few staged overrides
        return found
