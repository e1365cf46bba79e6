"""What the fleet runs, by group: the one input of every fleet read.

The store keeps, per (cluster, shape, backend, source), how many pods' newest decision
is there, split over the 100 stage buckets (``service/store/decisions.py``). A
``FleetSnapshot`` is those counts with each shape's request parsed once, and
``Fleet.groups`` hands them out per (cluster, shape) together with the *stage
classes* a set of overrides makes: the buckets split by which staged rollouts they
are in, so a pod group is decided once per class, never once per pod. The summary,
the regret, the exclusions, the rollout progress and the previews all read the fleet
this way, so their cost grows with clusters x situations, not with pods.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from operator import itemgetter
from typing import Any

from mla_switchboard.core.evaluator import (
    Assessment,
    Decision,
    DecisionInputs,
    OverrideSet,
    Refusal,
    applicable_overrides,
)
from mla_switchboard.core.evidence import EvidenceIndex, Situation, situation_of
from mla_switchboard.core.schemas import FLEET, Override, SelectRequest
from mla_switchboard.core.stages import STAGE_BUCKETS, stage_bucket, stage_buckets
from mla_switchboard.service.fleet.effects import (
    Dependence,
    StandIns,
    assess_shared,
    decide_shared,
    dependence,
    description,
)
from mla_switchboard.service.priority import let_the_loop_in, release_later
from mla_switchboard.service.state import PodState
from mla_switchboard.service.store.decisions import DecisionStore, FleetChange
from mla_switchboard.service.store.fleet import FleetStore
from mla_switchboard.service.store.rows import FleetGroup
from mla_switchboard.service.store.shapes import shape_of_json, shape_request

__all__ = [
    "Decider",
    "DecisionMemo",
    "Fleet",
    "FleetSnapshot",
    "KeptDecisions",
    "OverBudget",
    "PodGroup",
    "StageClass",
    "partial_rollouts",
    "stage_classes",
]


class OverBudget(Exception):
    """A fleet read took longer than its time budget (answered 503, retry later)."""


@dataclass(frozen=True)
class StageClass:
    """Buckets that every staged rollout in play treats alike: ``bucket`` is one of them
    (what the evaluator is given), ``buckets`` all of them (None: every bucket, as no
    partial rollout is in play)."""

    bucket: int | None
    buckets: frozenset[int] | None
    _pick: Callable[[Sequence[int]], Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.buckets is not None and len(self.buckets) > 1:
            object.__setattr__(self, "_pick", itemgetter(*sorted(self.buckets)))

    def count(self, group: FleetGroup) -> int:
        """The pods of ``group`` in these buckets (the counts picked in C: a fleet read
        counts every row of every staged group)."""
        if self.buckets is None:
            return group.pods
        if self._pick is None:
            return sum(group.buckets[i] for i in self.buckets)
        return sum(self._pick(group.buckets))


EVERY_POD = StageClass(None, None)


@dataclass(frozen=True)
class PodGroup:
    """Pods of one cluster and shape; ``rows`` per (backend, source) they run now;
    ``request`` is None when the shape no longer validates (recorded under an older
    schema): such pods are counted, never replayed."""

    cluster: str
    shape_id: str
    request: SelectRequest | None
    rows: tuple[FleetGroup, ...]

    @property
    def pods(self) -> int:
        return sum(r.pods for r in self.rows)


@dataclass(frozen=True)
class FleetSnapshot:
    version: int
    groups: tuple[PodGroup, ...]

    @property
    def pods(self) -> int:
        return sum(g.pods for g in self.groups)

    @cached_property
    def by_cluster(self) -> dict[str, tuple[PodGroup, ...]]:
        """Each cluster's groups, in snapshot order, found once per snapshot: a read
        that concerns one cluster (its override's rollout, a preview of its override)
        walks that cluster's groups, not the fleet's."""
        found: dict[str, list[PodGroup]] = {}
        for g in self.groups:
            found.setdefault(g.cluster, []).append(g)
        return {cluster: tuple(mine) for cluster, mine in found.items()}

    def of_cluster(self, cluster: str) -> tuple[PodGroup, ...]:
        return self.by_cluster.get(cluster, ())

    def visible(self, may_see: Callable[[str], bool] | None) -> FleetSnapshot:
        if may_see is None:
            return self
        return FleetSnapshot(self.version, tuple(g for g in self.groups if may_see(g.cluster)))

    @classmethod
    def build(
        cls,
        version: int,
        rows: Iterable[FleetGroup],
        shapes: dict[str, str],
        previous: FleetSnapshot | None = None,
    ) -> FleetSnapshot:
        """The snapshot of ``rows``. ``previous``: the one it replaces; its groups whose
        rows are the very same objects (``FleetStore.fleet_groups`` keeps an unchanged
        row's) are kept as they are, so a new version costs the groups it changed."""
        by_group: dict[tuple[str, str], list[FleetGroup]] = defaultdict(list)
        for row in rows:
            by_group[(row.cluster, row.shape_id)].append(row)
        before = {} if previous is None else previous.by_key
        groups = []
        for (cluster, shape_id), members in sorted(by_group.items()):
            members.sort(key=lambda r: (r.backend, r.source))
            kept = before.get((cluster, shape_id))
            if kept is not None and _same_rows(kept, members, shapes):
                groups.append(kept)
                continue
            shape = shapes.get(shape_id)
            request = None if shape is None else shape_request(shape, cluster)
            groups.append(PodGroup(cluster, shape_id, request, tuple(members)))
        return cls(version, tuple(groups))

    @cached_property
    def by_key(self) -> dict[tuple[str, str], PodGroup]:
        return {(g.cluster, g.shape_id): g for g in self.groups}

    def patched(self, changes: Sequence[FleetChange], shapes: dict[str, str]) -> FleetSnapshot:
        """This snapshot with ``changes`` (the transactions right after its version, in
        order) applied: what a read of every row would give as of the last one. Only
        the groups they touch are made again."""
        groups = dict(self.by_key)
        touched: dict[tuple[str, str], dict[tuple[str, str], FleetGroup]] = {}

        def rows_of(key: tuple[str, str]) -> dict[tuple[str, str], FleetGroup]:
            found = touched.get(key)
            if found is None:
                was = groups.get(key)
                rows = () if was is None else was.rows
                found = touched[key] = {(r.backend, r.source): r for r in rows}
            return found

        for change in changes:
            for row in change.rows:
                rows_of((row.cluster, row.shape_id))[(row.backend, row.source)] = row
            for cluster, shape_id, backend, source in change.gone:
                rows_of((cluster, shape_id)).pop((backend, source), None)
        for (cluster, shape_id), rows in touched.items():
            if not rows:
                groups.pop((cluster, shape_id), None)
                continue
            members = sorted(rows.values(), key=lambda r: (r.backend, r.source))
            was = groups.get((cluster, shape_id))
            shape = shapes.get(shape_id)
            if was is not None and (was.request is not None or shape is None):
                request = was.request
            else:
                request = None if shape is None else shape_request(shape, cluster)
            groups[(cluster, shape_id)] = PodGroup(cluster, shape_id, request, tuple(members))
        version = changes[-1].version if changes else self.version
        return FleetSnapshot(version, tuple(groups[k] for k in sorted(groups)))

    @classmethod
    def of_pods(cls, pods: Iterable[PodState], version: int = 0) -> FleetSnapshot:
        """The snapshot the store would hold for these pods (tests and tools)."""
        counts: dict[tuple[str, str, str, str], list[int]] = defaultdict(
            lambda: [0] * STAGE_BUCKETS
        )
        shapes: dict[str, str] = {}
        for p in pods:
            shape = shape_of_json(p.request_json)
            shapes[shape.id] = shape.json
            bucket = stage_bucket(p.cluster, p.pod)
            counts[(p.cluster, shape.id, p.backend, p.source)][bucket or 0] += 1
        rows = [FleetGroup(c, s, b, src, sum(v), tuple(v)) for (c, s, b, src), v in counts.items()]
        return cls.build(version, rows, shapes)


def _same_rows(kept: PodGroup, rows: Sequence[FleetGroup], shapes: dict[str, str]) -> bool:
    """Whether ``kept`` is the group of ``rows`` (the same row objects), its shape
    parsed as it would be now (one that was not readable may have become so)."""
    if len(kept.rows) != len(rows):
        return False
    if not all(a is b for a, b in zip(kept.rows, rows, strict=True)):
        return False
    shape = shapes.get(kept.shape_id)
    return kept.request is not None or shape is None or shape_request(shape, "x") is None


def partial_rollouts(
    request: SelectRequest, overrides: Sequence[Override], now: datetime
) -> tuple[Override, ...]:
    """The staged overrides in force for ``request`` whose stage is a part of the pods."""
    return _partial(applicable_overrides(request, overrides, now))


def _partial(applicable: Iterable[Override]) -> tuple[Override, ...]:
    """Those of ``applicable`` whose stage is a part of the pods."""
    return tuple(
        o
        for o in applicable
        if o.rollout is not None and o.rollout.state == "active" and o.rollout.percent < 100
    )


def stage_classes(rollouts: Sequence[Override]) -> tuple[StageClass, ...]:
    """The buckets split by which of ``rollouts`` they are in the stage of (found once
    per set of stages: a fleet read asks for each cluster's, and a thousand clusters
    each with its own rollout ask a thousand times per read)."""
    if not rollouts:
        return (EVERY_POD,)
    key = tuple((r.id, r.state, r.percent) for o in rollouts if (r := o.rollout) is not None)
    found = _classes_kept.get(key)
    if found is None:
        if len(_classes_kept) >= CLASSES_KEPT:
            _classes_kept.clear()
        found = _classes_kept[key] = _stage_classes(rollouts)
    return found


CLASSES_KEPT = 8192
"""How many sets of stages ``stage_classes`` keeps (emptied when full)."""
_classes_kept: dict[tuple[tuple[str, str, int], ...], tuple[StageClass, ...]] = {}


def _stage_classes(rollouts: Sequence[Override]) -> tuple[StageClass, ...]:
    stages = [stage_buckets(o.rollout) for o in rollouts if o.rollout is not None]
    by_bits: dict[tuple[bool, ...], list[int]] = defaultdict(list)
    for b in range(STAGE_BUCKETS):
        by_bits[tuple(b in stage for stage in stages)].append(b)
    return tuple(StageClass(members[0], frozenset(members)) for members in by_bits.values())


SITUATIONS_KEPT = 65536
"""How many shapes' situations ``shape_situation`` keeps (emptied when full)."""
_situations_kept: dict[str, Situation | None] = {}


def shape_situation(shape_id: str, request: SelectRequest) -> Situation | None:
    """The evidence situation of a shape's pods (``situation_of`` of its request, which
    names no cluster), worked out once per shape: a fleet read asks for every group's
    and a shape is in many clusters."""
    found = _situations_kept.get(shape_id, _situations_kept)
    if found is _situations_kept:
        if len(_situations_kept) >= SITUATIONS_KEPT:
            _situations_kept.clear()
        found = _situations_kept[shape_id] = situation_of(request)
    return found  # type: ignore[return-value]


def silent(index: EvidenceIndex, situation: Situation | None) -> bool:
    """Whether ``index`` says nothing a measured decision in ``situation`` would act on:
    no backend with enough samples from enough pods to be ranked, and no failure that
    could exclude one. A decision then reads as one on no evidence at all."""
    return all(
        not stats.failures and (stats.samples < index.min_samples or stats.pods < index.min_pods)
        for stats in index.group(situation).values()
    )


class DecisionMemo:
    """Decisions within one fleet read, shared by every group they hold for alike:
    keyed by what the evaluator reads of the shape (``effects.description``; the
    shape itself when evidence is read), which fleet overrides apply, which of the
    staged ones the pods are in the stage of, and how the decision depends on the
    cluster (``effects.dependence``: not at all, through the effect of the cluster's
    own override, or through the cluster itself). Clusters whose overrides act alike
    on a shape share one decision, made for a stand-in of their override; its words
    name each cluster's own override once rendered (``effects.words``).

    ``made`` counts the decisions and assessments made (what the growth tests count)."""

    def __init__(
        self,
        now: datetime,
        classes: ClassCache | None = None,
        kept: dict[tuple[object, ...], Decision | Refusal] | None = None,
    ) -> None:
        """``classes``: the read's, whose overrides that apply per cluster and model
        ``effects.dependence`` reads too; ``kept``: decisions of side "" kept across
        reads under the same rules and overrides (``KeptDecisions.under``)."""
        self._now = now
        self._kept = kept
        self._classes = classes or ClassCache()
        # thousands of decisions: freed gradually after a fleet read (service/priority.py)
        self._found: dict[tuple[object, ...], object] = release_later({})
        self._depends: dict[tuple[object, ...], Dependence] = {}
        self._described: dict[str, tuple[object, ...]] = {}
        self._silent: dict[tuple[int, str], tuple[EvidenceIndex, bool]] = {}
        self._tested: dict[tuple[object, int, str], tuple[EvidenceIndex, bool]] = release_later({})
        self._stand_ins = StandIns()
        self.made = 0

    def depends(
        self,
        request: SelectRequest,
        shape_id: str,
        inputs: DecisionInputs,
        narrow: Callable[[], DecisionInputs],
        exact: bool,
    ) -> Dependence:
        """``effects.dependence``, found once per overrides, cluster and model in this
        read (the inputs of one read are alive throughout it: their ids stay theirs);
        on the cluster's own evidence, the one for no evidence where ``narrow()``'s
        holds nothing for the shape's situation."""
        found = self.depends_of(request, inputs, exact)
        unmeasured = found.unmeasured
        if unmeasured is not None and self._says_nothing(narrow().evidence, shape_id, request):
            return unmeasured
        return found

    def depends_of(self, request: SelectRequest, inputs: DecisionInputs, exact: bool) -> Dependence:
        """:meth:`depends` before the shape's evidence is looked at: a function of the
        inputs, the cluster and the overrides that apply (``effects.dependence`` reads
        no more of the request), so found once for the cluster's models that the same
        overrides apply to: a cluster has a few models and most overrides name none."""
        key = (id(inputs.rules), id(inputs.overrides), request.cluster, request.model.name, exact)
        found = self._depends.get(key)
        if found is None:
            applicable = self._classes.applicable(request, inputs.overrides, self._now)
            alike = (key[0], key[1], key[2], exact, *map(id, applicable))
            found = self._depends.get(alike)
            if found is None:
                found = self._depends[alike] = dependence(
                    request, inputs, self._now, exact=exact, applicable=applicable
                )
            self._depends[key] = found
        return found

    def of_situation(
        self,
        test: Callable[[EvidenceIndex, Situation | None], bool],
        index: EvidenceIndex,
        shape_id: str,
        request: SelectRequest,
    ) -> bool:
        """``test(index, situation)`` of the shape's situation, once per test, index
        and shape in this read (the index is held with the answer: its id stays its
        own): the clusters that trust one index ask it of the same shapes."""
        key = (test, id(index), shape_id)
        found = self._tested.get(key)
        if found is None or found[0] is not index:
            found = self._tested[key] = (index, test(index, shape_situation(shape_id, request)))
        return found[1]

    def _says_nothing(self, index: EvidenceIndex, shape_id: str, request: SelectRequest) -> bool:
        """:func:`silent` of ``index`` for the shape's situation, once per index and shape
        in this read (the index is held with the answer: its id stays its own)."""
        key = (id(index), shape_id)
        found = self._silent.get(key)
        if found is None or found[0] is not index:
            found = self._silent[key] = (index, silent(index, shape_situation(shape_id, request)))
        return found[1]

    def _key(
        self,
        kind: str,
        request: SelectRequest,
        shape_id: str,
        stage: StageClass,
        depends: Dependence,
        by_shape: bool = False,
    ) -> tuple[object, ...]:
        """``by_shape``: keyed by the shape itself, as when evidence is read."""
        bits = depends.bits(request, stage.bucket) if depends.staged else ()
        return (
            kind,
            depends.decided_as(bits) if kind == "decide" else depends.key,
            depends.fleet,
            bits,
            self.shape_part(request, shape_id, depends, by_shape),
        )

    def shape_part(
        self, request: SelectRequest, shape_id: str, depends: Dependence, by_shape: bool = False
    ) -> object:
        """What a key holds of the shape: the shape itself when evidence is read (or
        ``by_shape``), else what the evaluator reads of it (``effects.description``)."""
        if by_shape or depends.evidence:
            return shape_id
        shape = self._described.get(shape_id)
        if shape is None:
            shape = self._described[shape_id] = description(request)
        return shape

    def made_for(
        self,
        key: tuple[object, ...],
        request: SelectRequest,
        shape_id: str,
        narrowed: DecisionInputs,
        bucket: int | None,
        depends: Dependence,
    ) -> Decision | Refusal:
        """The decision kept under ``key`` (as :meth:`decision` builds it), made now
        when there is none (with the shape's situation, worked out once per shape)."""
        found = self._found.get(key)
        if found is None:
            kept = self._kept if key[0] == "" and not depends.evidence else None
            found = None if kept is None else kept.get(key)
            if found is not None:
                self._found[key] = found
                return found
            self.made += 1
            situation = shape_situation(shape_id, request)
            found = self._found[key] = decide_shared(
                request, narrowed, self._now, bucket, depends, situation, self._stand_ins
            )
            if kept is not None:
                kept[key] = found
        return found  # type: ignore[return-value]

    def decider(
        self,
        request: SelectRequest,
        inputs: DecisionInputs,
        narrow: Callable[[], DecisionInputs],
        *,
        side: str = "",
        exact: bool = False,
    ) -> Decider:
        """:meth:`decision` for the groups of one cluster and model under ``inputs``
        (``request``: any of theirs; ``narrow()``: the evidence they trust), with what
        those share found once: a fleet read asks per group and stage class."""
        return Decider(self, request, inputs, narrow, side, exact)

    def decision(
        self,
        request: SelectRequest,
        shape_id: str,
        stage: StageClass,
        inputs: DecisionInputs,
        narrow: Callable[[], DecisionInputs],
        *,
        side: str = "",
        exact: bool = False,
    ) -> Decision | Refusal:
        """The decision for the pods of ``shape_id`` in ``stage`` of ``request``'s
        cluster under ``inputs`` (``narrow()``: with the evidence they trust);
        ``side``: which inputs these are, when a read has several; ``exact``: never
        shared through a stand-in (see ``effects.dependence``)."""
        depends = self.depends(request, shape_id, inputs, narrow, exact)
        key = (side, *self._key("decide", request, shape_id, stage, depends))
        found = self._found.get(key)
        if found is None:
            narrowed = narrow() if depends.evidence else inputs  # as ``Decider`` does
            return self.made_for(key, request, shape_id, narrowed, stage.bucket, depends)
        return found  # type: ignore[return-value]

    def assessment(
        self,
        request: SelectRequest,
        shape_id: str,
        stage: StageClass,
        inputs: DecisionInputs,
        narrowed: DecisionInputs,
    ) -> Assessment:
        """``assess`` of the pods of ``shape_id`` in ``stage``, shared as
        :meth:`decision` shares decisions, by shape: an assessment names the situation."""
        depends = self.depends(request, shape_id, inputs, lambda: narrowed, False)
        key = self._key("assess", request, shape_id, stage, depends, by_shape=True)
        found = self._found.get(key)
        if found is None:
            self.made += 1
            situation = shape_situation(shape_id, request)
            found = self._found[key] = assess_shared(
                request, narrowed, self._now, stage.bucket, depends, situation, self._stand_ins
            )
        return found  # type: ignore[return-value]


class KeptDecisions:
    """The decisions of fleet reads under the configuration in force (side "") that
    read no evidence, kept from one read to the next while the rules and overrides are
    the same objects: such a decision is a function of its key (how it depends on the
    cluster, the fleet's overrides that apply, which are held here, the stage bits and
    the description) and of those alone, not of the evidence nor of the read's time
    but through which overrides apply, which the key holds. So the dry run of a change
    never seen takes the configuration in force's decisions that the summary before it
    made, and the previews after it those the dry run made, instead of deciding them
    again. Read and written by the replica's one fleet-read thread."""

    def __init__(self) -> None:
        self._under: DecisionInputs | None = None
        self._found: dict[tuple[object, ...], Decision | Refusal] = {}

    def under(self, inputs: DecisionInputs) -> dict[tuple[object, ...], Decision | Refusal]:
        """The decisions kept under ``inputs``' rules and overrides (emptied when they
        are other objects; ``inputs`` is held, so the ids in the keys stay theirs)."""
        was = self._under
        if was is None or was.rules is not inputs.rules or was.overrides is not inputs.overrides:
            self._under, self._found = inputs, {}
        return self._found


class Decider:
    """:meth:`DecisionMemo.decision` for the groups of one cluster and model: how their
    decisions depend on the cluster (``effects.dependence``), the evidence they trust,
    and the pods' stage bits per bucket are found once, so deciding a group is a key
    and a lookup. Keys and decisions are the memo's own: a decision made here is the
    one :meth:`DecisionMemo.decision` finds, and the other way round."""

    __slots__ = (
        "_base",
        "_bits",
        "_by_shape",
        "_exact",
        "_inputs",
        "_memo",
        "_narrow",
        "_narrowed",
        "_request",
        "_side",
    )

    def __init__(
        self,
        memo: DecisionMemo,
        request: SelectRequest,
        inputs: DecisionInputs,
        narrow: Callable[[], DecisionInputs],
        side: str,
        exact: bool,
    ) -> None:
        self._memo, self._request, self._inputs = memo, request, inputs
        self._narrow, self._side, self._exact = narrow, side, exact
        self._base: Dependence | None = None  # found on the first decision asked
        self._narrowed: DecisionInputs | None = None
        self._by_shape: dict[str, tuple[Dependence, object]] = {}
        self._bits: dict[tuple[int, int], tuple[bool, ...]] = {}

    def narrowed(self) -> DecisionInputs:
        """``narrow()``, asked once."""
        found = self._narrowed
        if found is None:
            found = self._narrowed = self._narrow()
        return found

    def __call__(
        self, request: SelectRequest, shape_id: str, stage: StageClass
    ) -> Decision | Refusal:
        """The decision for the pods of ``shape_id`` in ``stage`` (``request``: the
        group's, of this decider's cluster and model)."""
        memo = self._memo
        found = self._by_shape.get(shape_id)
        if found is None:
            depends = self._base
            if depends is None:
                depends = self._base = memo.depends_of(self._request, self._inputs, self._exact)
            unmeasured = depends.unmeasured
            if unmeasured is not None and memo._says_nothing(
                self.narrowed().evidence, shape_id, request
            ):
                depends = unmeasured
            found = self._by_shape[shape_id] = (
                depends,
                memo.shape_part(request, shape_id, depends),
            )
        depends, shape = found
        if not depends.staged:
            bits: tuple[bool, ...] = ()
        elif stage.bucket is None:  # the pod's own bucket: the request's cluster and pod
            bits = depends.bits(request, None)
        else:
            at = (id(depends), stage.bucket)
            bits = self._bits.get(at)  # type: ignore[assignment]
            if bits is None:
                bits = self._bits[at] = depends.bits(request, stage.bucket)
        key = (self._side, "decide", depends.decided_as(bits), depends.fleet, bits, shape)
        decided = memo._found.get(key)
        if decided is None:
            # a decision that reads no evidence is made on the inputs as they are: the
            # evidence its pods trust is not looked for (``narrowed``)
            inputs = self.narrowed() if depends.evidence else self._inputs
            return memo.made_for(key, request, shape_id, inputs, stage.bucket, depends)
        return decided  # type: ignore[return-value]


class ClassCache:
    """Stage classes per set of partial rollouts, and the partial rollouts per
    cluster and model, within one fleet read."""

    def __init__(self) -> None:
        self._found: dict[tuple[int, ...], tuple[StageClass, ...]] = {}
        self._partials: dict[tuple[int, str, str], tuple[Override, ...]] = {}
        self._applicable: dict[tuple[int, str, str], tuple[Override, ...]] = {}
        self._stages: dict[tuple[int, str, str], tuple[StageClass, ...]] = {}
        self._blind: dict[tuple[int, str], bool] = {}  # ``model_key``

    def applicable(
        self, request: SelectRequest, overrides: Sequence[Override], now: datetime
    ) -> tuple[Override, ...]:
        """``applicable_overrides``, once per set of overrides, cluster and model; once
        per set and cluster when none of those that may apply names a model (then
        every model of the cluster has the same apply: most clusters' case)."""
        key = (id(overrides), request.cluster, request.model.name)
        found = self._applicable.get(key)
        if found is None:
            every = (id(overrides), request.cluster)
            found = self._applicable.get(every)
            if found is None:
                found = tuple(applicable_overrides(request, overrides, now))
                if all(o.model is None for o in _may_apply(overrides, request.cluster)):
                    self._applicable[every] = found
            self._applicable[key] = found
        return found

    def model_key(self, request: SelectRequest, *sides: Sequence[Override]) -> str:
        """What the work a read does per cluster and model depends on of the model
        under each of ``sides`` (sets of overrides): its name where an override that
        may apply to the cluster names a model, else "" (no override reads the model,
        so which apply, the stage classes, how decisions depend on the cluster and the
        evidence its pods trust are the same for each of its models: found once)."""
        for overrides in sides:
            key = (id(overrides), request.cluster)
            blind = self._blind.get(key)
            if blind is None:
                may = _may_apply(overrides, request.cluster)
                blind = self._blind[key] = all(o.model is None for o in may)
            if not blind:
                return request.model.name
        return ""

    def partials(
        self, request: SelectRequest, overrides: Sequence[Override], now: datetime
    ) -> tuple[Override, ...]:
        """``partial_rollouts``, once per set of overrides, cluster and model (what
        decides which apply: the model glob; the read's ``now`` is one)."""
        key = (id(overrides), request.cluster, request.model.name)
        found = self._partials.get(key)
        if found is None:
            if isinstance(overrides, OverrideSet) and not overrides.staged_for(request.cluster):
                found = ()  # none that may apply is partial: which apply is not asked
            else:
                found = _partial(self.applicable(request, overrides, now))
            self._partials[key] = found
        return found

    def stages(
        self, request: SelectRequest, overrides: Sequence[Override], now: datetime
    ) -> tuple[StageClass, ...]:
        """The stage classes of ``request``'s partial rollouts (``of(partials(...))``),
        once per set of overrides, cluster and model: a read asks per group."""
        key = (id(overrides), request.cluster, request.model.name)
        found = self._stages.get(key)
        if found is None:
            found = self._stages[key] = self.of(self.partials(request, overrides, now))
        return found

    def of(self, rollouts: Sequence[Override]) -> tuple[StageClass, ...]:
        key = tuple(id(o) for o in rollouts)
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = stage_classes(rollouts)
        return found


def _may_apply(overrides: Sequence[Override], cluster: str) -> Sequence[Override]:
    """The overrides ``applicable_overrides`` reads for a pod of ``cluster``."""
    if isinstance(overrides, OverrideSet):
        return overrides.for_cluster(cluster)
    return [o for o in overrides if o.cluster in (FLEET, cluster)]


YIELD_EVERY_S = 0.0005
"""How often a fleet read hands the interpreter to the event loop (``Deadline.check``)."""


class Deadline:
    """A fleet read's budget of CPU time, checked between groups; a check also lets the
    event loop in (``service/priority.py``) when it has not for ``YIELD_EVERY_S``, so
    the loop never waits for the interpreter much longer than that and one group.

    A yield is a real sleep (about 80-100 us of wall time and 20-80 us of the thread's
    CPU on the 2-core VMs the benchmarks run on), so once per group made a read of
    6,000 groups a second slower without doing any of its work; every half millisecond
    it costs a fifth of a read's CPU there. So it is made only while the loop may be
    waiting for the interpreter (``priority.let_the_loop_in``): a read nobody waits on
    runs through.

    What is counted is the CPU time of the thread that made the deadline (the read's
    own, ``time.thread_time``), not the wall clock: the fleet-read thread runs at a
    lower priority than the event loop and yields to it, so on a busy replica a read
    may take several times its CPU in wall time, and that wait is the loop's work, not
    the read's. ``clock`` is for tests."""

    def __init__(
        self, budget_s: float | None, clock: Callable[[], float] = time.thread_time
    ) -> None:
        self._clock = clock
        self._at = None if budget_s is None else clock() + budget_s
        self._budget = budget_s
        self._yield_at = 0.0  # the first check yields

    def check(self) -> None:
        """Let the loop in, and check the budget, when ``YIELD_EVERY_S`` has passed: a
        thread's CPU clock is a system call (1.3 us on the 2-core VM, more than a group
        of a cached read costs), so it is read as often as the loop is let in, not per
        group."""
        now = time.monotonic()
        if now < self._yield_at:
            return
        let_the_loop_in()
        self._yield_at = now + YIELD_EVERY_S
        if self._at is not None and self._clock() > self._at:
            raise OverBudget(f"fleet read over its {self._budget:g} s budget of CPU time")


def each_group(
    snapshot: FleetSnapshot | Iterable[PodGroup], deadline: Deadline | None = None
) -> Iterator[PodGroup]:
    """The groups of a snapshot (or any of its groups), checking ``deadline`` before each."""
    groups = snapshot.groups if isinstance(snapshot, FleetSnapshot) else snapshot
    for group in groups:
        if deadline is not None:
            deadline.check()
        yield group


class Fleet:
    """The store's fleet counts as of its ``fleet_version``, read once per version.

    Which version is the latest is known without asking the store: this replica's
    writer says what each of its batches made, and the config poller sees the others'
    (every ``SWITCHBOARD_CONFIG_POLL_S``). So ``current()`` is a lookup while nothing
    changed; when only this replica changed the counts since, their changes are applied
    to the snapshot (``DecisionStore.fleet_changes_since``: the groups they touched);
    otherwise it reads the O(groups) rows again (shapes are read once each: they never
    change). Another replica's decisions show within the poll."""

    def __init__(self, decisions: DecisionStore, counts: FleetStore) -> None:
        """``decisions``: what this replica's writer moved the fleet's version to;
        ``counts``: the fleet's counts by group, and the shapes they name."""
        self._decisions = decisions
        self._counts = counts
        self._lock = threading.Lock()
        self._snapshot: FleetSnapshot | None = None
        self._seen = 0  # the newest fleet_version the poller reported

    def saw(self, version: int) -> None:
        self._seen = max(self._seen, version)

    def notify(self, versions: Mapping[str, int]) -> None:
        """The store's versions, as the config poller just read them: other replicas'
        decisions move ``fleet_version``."""
        self.saw(versions.get("fleet_version", 0))

    @property
    def latest(self) -> int:
        return max(self._seen, self._decisions.fleet_version_written)

    def kept(self) -> FleetSnapshot | None:
        """The snapshot, when it is the latest known (no I/O: for the event loop)."""
        snap = self._snapshot
        return snap if snap is not None and snap.version >= self.latest else None

    def current(self) -> FleetSnapshot:
        with self._lock:
            snap = self.kept()
            if snap is not None:
                return snap
            patched = self._patched()
            if patched is not None:
                self._snapshot = patched
                return patched
            version, rows = self._counts.fleet_groups()
            shapes = self._counts.shapes({r.shape_id for r in rows})
            self.saw(version)
            self._snapshot = FleetSnapshot.build(version, rows, shapes, self._snapshot)
            return self._snapshot

    def _patched(self) -> FleetSnapshot | None:
        """The snapshot moved to the latest version by this replica's own changes, when
        they are every change since it (no other replica wrote meanwhile): no I/O but
        the shapes of new groups, and a cost of the groups those changes touched. None
        when there is a gap (a full read then)."""
        snap = self._snapshot
        if snap is None:
            return None
        changes = self._decisions.fleet_changes_since(snap.version)
        if not changes or changes[-1].version < self.latest:  # another replica wrote
            return None
        if any(c.version != snap.version + i for i, c in enumerate(changes, start=1)):
            return None
        shapes = self._counts.shapes({r.shape_id for c in changes for r in c.rows})
        return snap.patched(changes, shapes)
