"""Rollout progress: each staged override's pods in scope, in the stage and booted
with it, and the stage's measured speed against the rest, counted per group and stage
bucket (``service/fleet/groups.py``), never per pod."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mla_switchboard.core.evaluator import (
    Decision,
    DecisionInputs,
    Refusal,
    in_stage,
)
from mla_switchboard.core.evidence import EvidenceIndex, Situation
from mla_switchboard.core.schemas import FLEET, Override, SelectRequest
from mla_switchboard.core.stages import STAGE_BUCKETS, stage_buckets
from mla_switchboard.service.fleet.groups import (
    ClassCache,
    Deadline,
    Decider,
    DecisionMemo,
    FleetSnapshot,
    PodGroup,
    StageClass,
    each_group,
    shape_situation,
)
from mla_switchboard.service.fleet.narrowing import per_model
from mla_switchboard.service.selector import InputsFor

ALL_BUCKETS: frozenset[int | None] = frozenset([*range(STAGE_BUCKETS), None])
"""Every stage bucket, and None: pods without a name (never in a partial stage)."""


def progress(
    fleet: FleetSnapshot,
    inputs: DecisionInputs,
    *,
    now: datetime,
    inputs_for: InputsFor | None = None,
    deadline: Deadline | None = None,
    evidence_of: Callable[[str], EvidenceIndex] | None = None,
) -> list[dict[str, Any]]:
    """Each staged override's progress, for the summary and the dashboard: pods in its
    scope and in the stage, how many booted with it (their newest decision runs what
    the override gives them), failures counted, and the stage's measured speed against
    the rest of the scope (median TFLOP/s of the backends each part runs, from the
    samples of its own pods). Counted per group and stage bucket, never per pod, and
    per cluster: a cluster's override walks that cluster's groups only, the fleet's
    (``*``) every group once (:meth:`ProgressWalk.cluster`).

    ``evidence_of(cluster)`` gives one cluster's own evidence index (the runtime's
    per-cluster ones); without it, each cluster's samples are picked out of
    ``inputs.evidence``. Either way the samples are split by the stage buckets stored
    with them, never by hashing pod names again."""
    walk = ProgressWalk(inputs, now, inputs_for, evidence_of)
    out = []
    for o in sorted(inputs.overrides, key=lambda o: o.cluster):
        if o.rollout is None:
            continue
        tally = RolloutTally.of(o)
        clusters = fleet.by_cluster if o.cluster == FLEET else (o.cluster,)
        for cluster in clusters:
            tally.merge(walk.cluster(o, fleet.of_cluster(cluster), deadline))
        out.append(tally.summary())
    return out


class ProgressWalk:
    """What the rollouts' progress shares within one read: the inputs, the stage
    classes and the decisions (each group decided once per class, and shared with
    every cluster it holds for alike: ``DecisionMemo``)."""

    def __init__(
        self,
        inputs: DecisionInputs,
        now: datetime,
        inputs_for: InputsFor | None = None,
        evidence_of: Callable[[str], EvidenceIndex] | None = None,
        memo: DecisionMemo | None = None,
        classes: ClassCache | None = None,
        samples: StageSamples | None = None,
    ) -> None:
        """``samples``: the stage samples kept across reads (None: read each time)."""
        self.inputs, self.now, self.inputs_for = inputs, now, per_model(inputs_for)
        self.samples = samples
        self.evidence_of = evidence_of or (lambda _: inputs.evidence)
        self.classes = classes or ClassCache()
        self.memo = memo or DecisionMemo(now, self.classes)

    def cluster(
        self,
        o: Override,
        groups: Sequence[PodGroup],
        deadline: Deadline | None = None,
        given: Mapping[tuple[str, frozenset[int] | None], str | None] | None = None,
        cells: list[tuple[PodGroup, StageClass]] | None = None,
    ) -> RolloutTally:
        """``o``'s progress among ``groups`` (one cluster's): what
        :class:`RolloutTally` adds up, to be merged with the other clusters'.
        ``given``: the backend the configuration gives the cluster's pods per (shape,
        stage class), when the caller keeps it (``parts.ClusterPart.given``): a group
        it holds is then not decided again (only its backend is counted). ``cells``:
        appended each (group, stage class) in ``o``'s stage, whose pods ``booted``
        counts (``Counted``)."""
        tally = RolloutTally.of(o)
        # per model (what decides whether ``o`` applies, and the stage classes; the
        # cluster alone where no override names a model: ``ClassCache.model_key``):
        # the classes with whether each is in ``o``'s stage, and the decisions of its
        # groups; None where ``o`` does not apply
        staging: dict[str, tuple[tuple[tuple[StageClass, bool], ...], Decider] | None] = {}
        overrides = self.inputs.overrides
        for group in each_group(groups, deadline):
            request = group.request
            if o.cluster not in (FLEET, group.cluster) or request is None:
                continue
            model = self.classes.model_key(request, overrides)
            found = staging.get(model, ())
            if found == ():
                found = staging[model] = self._plan(o, request)
            if found is None:
                continue
            stages, decided = found
            tally.scoped += group.pods
            for stage, inside in stages:
                if not inside:
                    continue  # pods outside the stage add to neither count
                if cells is not None:
                    cells.append((group, stage))
                at = (group.shape_id, stage.buckets)
                if given is not None and at in given:
                    tally.count_backend(group, stage, inside, given[at])
                    continue
                tally.count(group, stage, inside, decided(request, group.shape_id, stage))
            situation = shape_situation(group.shape_id, request)
            if situation is not None:
                tally.sample(group, situation, self.evidence_of, self.samples)
        return tally

    def _plan(
        self, o: Override, request: SelectRequest
    ) -> tuple[tuple[tuple[StageClass, bool], ...], Decider] | None:
        """``_stages`` of ``request``'s cluster and model, with the decider of their
        groups; None when ``o`` does not apply to them."""
        stages = self._stages(o, request)
        if stages is None:
            return None
        inputs, now, inputs_for = self.inputs, self.now, self.inputs_for

        def narrowed() -> DecisionInputs:
            return inputs if inputs_for is None else inputs_for(request, inputs, now)

        return stages, self.memo.decider(request, inputs, narrowed)

    def _stages(
        self, o: Override, request: SelectRequest
    ) -> tuple[tuple[StageClass, bool], ...] | None:
        """The stage classes of ``request``'s pods, each with whether it is in ``o``'s
        stage; None when ``o`` does not apply to them."""
        inputs, now = self.inputs, self.now
        if not any(x is o for x in self.classes.applicable(request, inputs.overrides, now)):
            return None
        stages = self.classes.stages(request, inputs.overrides, now)
        return tuple((stage, in_stage(request, o, stage.bucket)) for stage in stages)


@dataclass(frozen=True)
class Counted:
    """One cluster's progress of one staged override, with what all of it but
    ``booted`` was worked out from. Whether the override applies to a group, the stage
    classes and which are in its stage are functions of the override itself, the
    cluster's groups and its partial rollouts (``DecisionInputs.staged_for``, and
    which have expired); the stage samples of its evidence index, at its version. A
    configuration that changes none of them (a fleet-wide deny, a note) moves only
    ``booted``: pods in the stage that run what the configuration gives them,
    recounted from the backends it gives (``recounted``) over the groups and stage
    classes in the stage (``cells``), not by walking the cluster's groups again."""

    override: Override
    groups: tuple[PodGroup, ...]
    staged: tuple[tuple[Override, bool], ...]
    evidence: EvidenceIndex
    version: int
    tally: RolloutTally
    cells: tuple[tuple[PodGroup, StageClass], ...]

    def holds(
        self,
        override: Override,
        groups: Sequence[PodGroup],
        staged: Sequence[tuple[Override, bool]],
        evidence: EvidenceIndex,
    ) -> bool:
        """Whether the figures but ``booted`` hold for ``override`` among ``groups``
        with these partial rollouts (and their expiry) and this evidence index: the
        very objects, at the same version."""
        return (
            override is self.override
            and groups is self.groups
            and evidence is self.evidence
            and evidence.version == self.version
            and len(staged) == len(self.staged)
            and all(a[0] is b[0] and a[1] == b[1] for a, b in zip(staged, self.staged, strict=True))
        )

    def recounted(
        self, given: Mapping[tuple[str, frozenset[int] | None], str | None]
    ) -> RolloutTally | None:
        """The tally with ``booted`` counted again from ``given`` (backends per shape and
        stage class); None when ``given`` lacks one of the cells."""
        booted = 0
        for group, stage in self.cells:
            backend = given.get((group.shape_id, stage.buckets), _ABSENT)
            if backend is _ABSENT:
                return None
            if backend is None:
                continue
            for row in group.rows:
                if row.backend == backend:
                    booted += stage.count(row)
        was = self.tally
        tally = RolloutTally.of(was.override)
        tally.scoped, tally.in_stage, tally.booted = was.scoped, was.in_stage, booted
        # read, never changed: a merge extends the merged tally's own lists and set
        tally.stage_speed, tally.rest_speed, tally.sampled = (
            was.stage_speed,
            was.rest_speed,
            was.sampled,
        )
        return tally


_ABSENT = object()


class RolloutTally:
    """One staged override's counts and speeds, added up group by group; the tallies of
    several clusters merge into the override's (sums, and the speeds' lists joined:
    their medians do not depend on the order)."""

    @classmethod
    def of(cls, override: Override) -> RolloutTally:
        return cls(override)

    def __init__(self, override: Override) -> None:
        rollout = override.rollout
        assert rollout is not None
        self.override, self.rollout = override, rollout
        inside: frozenset[int | None] = frozenset(stage_buckets(rollout))
        if len(inside) == STAGE_BUCKETS:
            inside = ALL_BUCKETS  # complete: every pod, named or not
        self.inside_buckets, self.outside_buckets = inside, ALL_BUCKETS - inside
        self.scoped = self.in_stage = self.booted = 0
        self.stage_speed: list[float] = []
        self.rest_speed: list[float] = []
        self.sampled: set[tuple[str, Situation, str]] = set()

    def merge(self, other: RolloutTally) -> None:
        """Add another part of the override's scope (another cluster's groups)."""
        self.scoped += other.scoped
        self.in_stage += other.in_stage
        self.booted += other.booted
        self.stage_speed.extend(other.stage_speed)
        self.rest_speed.extend(other.rest_speed)
        self.sampled |= other.sampled

    def count(
        self, group: PodGroup, stage: StageClass, inside: bool, given: Decision | Refusal | None
    ) -> None:
        """Pods of ``group`` in ``stage``: in the override's stage, and booted with it."""
        backend = given.backend.value if isinstance(given, Decision) else None
        self.count_backend(group, stage, inside, backend)

    def count_backend(
        self, group: PodGroup, stage: StageClass, inside: bool, backend: str | None
    ) -> None:
        """:meth:`count` of pods the configuration gives ``backend`` (None: refused)."""
        for row in group.rows:
            n = stage.count(row)
            if not n:
                continue
            self.in_stage += n if inside else 0
            if backend is not None and backend == row.backend:
                self.booted += n

    def sample(
        self,
        group: PodGroup,
        situation: Situation,
        evidence_of: Callable[[str], EvidenceIndex],
        kept: StageSamples | None = None,
    ) -> None:
        """The group's own samples, split by the stage buckets stored with them;
        ``kept``: those read before, while the cluster's index is at the same version."""
        for row in group.rows:
            key = (group.cluster, situation, row.backend)
            if key in self.sampled:
                continue  # shapes that differ only in what the evidence ignores
            self.sampled.add(key)
            evidence = evidence_of(group.cluster)
            if kept is None:
                inside, outside = self.speeds(evidence, group.cluster, situation, row.backend)
            else:
                inside, outside = kept.of(self, evidence, group.cluster, situation, row.backend)
            self.stage_speed.extend(inside)
            self.rest_speed.extend(outside)

    def speeds(
        self, evidence: EvidenceIndex, cluster: str, situation: Situation, backend: str
    ) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The TFLOP/s of ``cluster``'s samples of ``backend`` in ``situation``: those of
        pods in the stage, and of the rest."""

        def of(buckets: frozenset[int | None]) -> tuple[float, ...]:
            samples = evidence.stage_samples(situation, backend, buckets)
            return tuple(tflops for found, _, tflops in samples if found == cluster)

        return of(self.inside_buckets), of(self.outside_buckets)

    def summary(self) -> dict[str, Any]:
        o, r = self.override, self.rollout
        return {
            "cluster": o.cluster,
            "revision": o.revision,
            "rollout": r.model_dump(mode="json"),
            "pods_in_scope": self.scoped,
            "pods_in_stage": self.in_stage,
            "pods_booted_with_it": self.booted,
            "failures": r.failures,
            "stage_median_tflops": _median(self.stage_speed),
            "rest_median_tflops": _median(self.rest_speed),
        }


class StageSamples:
    """The samples a rollout's progress read of each cluster, situation and backend,
    kept across reads while the cluster's evidence index is the same object at the
    same version (its version moves with every change to what it counts): a change
    of configuration moves every cluster's figures, not their evidence. Read and
    written by the replica's one fleet-read thread; emptied when full."""

    KEEP = 65536

    def __init__(self) -> None:
        self._kept: dict[
            tuple[str, Situation, str, tuple[str, str, int]],
            tuple[EvidenceIndex, int, tuple[tuple[float, ...], tuple[float, ...]]],
        ] = {}

    def of(
        self,
        tally: RolloutTally,
        evidence: EvidenceIndex,
        cluster: str,
        situation: Situation,
        backend: str,
    ) -> tuple[tuple[float, ...], tuple[float, ...]]:
        r = tally.rollout
        key = (cluster, situation, backend, (r.id, r.state, r.percent))
        found = self._kept.get(key)
        version = evidence.version
        if found is None or found[0] is not evidence or found[1] != version:
            if len(self._kept) >= self.KEEP:
                self._kept.clear()
            speeds = tally.speeds(evidence, cluster, situation, backend)
            found = self._kept[key] = (evidence, version, speeds)
        return found[2]


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None
