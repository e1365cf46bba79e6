"""Regret: the prefill throughput a cluster leaves on the table with its current choices.

For every pod whose situation has measured evidence, compare the median TFLOP/s of the
backend it runs with the best *valid* backend measured for that situation (valid for
that pod, overrides' denies included). Per cluster the figure is
``1 - sum(chosen) / sum(best)`` over those pods: the share of attention-prefill
throughput lost, as a fleet operator would add it up. Pods are taken by group
(``service/fleet/groups.py``): one assessment per cluster, shape and stage class.

Both figures here are a cluster's own (its groups, its overrides, the evidence it
trusts), so each is worked out per cluster (:func:`cluster_regret`,
:func:`cluster_exclusions`) and a fleet read may keep a cluster's until what it depends
on changes (``service/fleet/parts.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from mla_switchboard.core.causes import MeasuredExclusion
from mla_switchboard.core.evaluator import (
    Assessment,
    DecisionInputs,
)
from mla_switchboard.core.evidence import EvidenceIndex, Situation
from mla_switchboard.core.schemas import SelectRequest
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.fleet.groups import (
    ClassCache,
    Deadline,
    DecisionMemo,
    FleetSnapshot,
    PodGroup,
    StageClass,
    each_group,
    shape_situation,
)
from mla_switchboard.service.fleet.narrowing import per_model
from mla_switchboard.service.selector import InputsFor


def regret_by_cluster(
    fleet: FleetSnapshot,
    inputs: DecisionInputs,
    *,
    now: datetime,
    inputs_for: InputsFor | None = None,
    deadline: Deadline | None = None,
) -> dict[str, dict[str, Any]]:
    """Per cluster: pods, pods measured, pods on their best backend, the share of
    throughput lost and the best alternatives. Validity comes from the evaluator's
    ``assess`` (spec, engine, denies and, under policy measured, failure evidence)."""
    classes = ClassCache()
    memo = DecisionMemo(now, classes)
    inputs_for = per_model(inputs_for)
    return {
        cluster: cluster_regret(
            groups,
            inputs,
            now=now,
            inputs_for=inputs_for,
            deadline=deadline,
            classes=classes,
            memo=memo,
        )
        for cluster, groups in sorted(fleet.by_cluster.items())
    }


def cluster_regret(
    groups: Sequence[PodGroup],
    inputs: DecisionInputs,
    *,
    now: datetime,
    inputs_for: InputsFor | None = None,
    deadline: Deadline | None = None,
    classes: ClassCache | None = None,
    memo: DecisionMemo | None = None,
    rankable: Sequence[PodGroup] | None = None,
    valid: Mapping[tuple[str, frozenset[int] | None], tuple[Backend, ...] | None] | None = None,
    pods: int | None = None,
) -> dict[str, Any]:
    """One cluster's regret (``regret_by_cluster``'s entry), from its ``groups``.
    ``classes``, ``memo``: shared by the clusters of one read (an assessment holds for
    every cluster that decides the group alike: ``DecisionMemo``). ``rankable``: those
    of ``groups`` (in their order) whose situation the evidence they trust could rank,
    when the caller keeps them (``parts.Telling``): the others add their pods only, so
    only these are read. ``valid``: the backends valid per (shape, stage class) under
    ``inputs``, where the caller has them from decisions already made (a preview of
    this configuration, ``parts.ClusterPart.valid``): those groups are not assessed
    again (an assessment's situation is the shape's: ``shape_situation``). ``pods``:
    the pods of ``groups``, when the caller has counted them."""
    classes = classes or ClassCache()
    memo = memo or DecisionMemo(now, classes)
    inputs_for = per_model(inputs_for)
    measured_pods = on_best = 0
    chosen_sum = best_sum = 0.0
    switch_to: dict[str, int] = defaultdict(int)
    if pods is None:
        pods = sum(g.pods for g in groups)
    for group in each_group(groups if rankable is None else rankable, deadline):
        request = group.request
        if request is None:
            continue
        narrowed = inputs if inputs_for is None else inputs_for(request, inputs, now)
        evidence = narrowed.evidence
        if not memo.of_situation(situation_rankable, evidence, group.shape_id, request):
            continue  # nothing measured enough to rank for these pods: no assessment needed
        for stage in classes.stages(request, inputs.overrides, now):
            known = None if valid is None else valid.get((group.shape_id, stage.buckets))
            if known is None:
                assessed = _assessed(memo, request, group, stage, inputs, narrowed, now)
                situation, backends = assessed.situation, assessed.valid()
            else:
                situation, backends = shape_situation(group.shape_id, request), known
            if situation is None:
                break
            measured = evidence.group(situation)
            ranked = evidence.eligible(situation, backends)
            if not ranked:
                continue
            best_backend, best = ranked[0]
            for row in group.rows:
                n = stage.count(row)
                try:
                    chosen = measured.get(Backend(row.backend))
                except ValueError:
                    continue
                if not n or chosen is None or chosen.median_tflops is None:
                    continue
                best_tflops = max(best.median_tflops or 0.0, chosen.median_tflops)
                measured_pods += n
                chosen_sum += n * chosen.median_tflops
                best_sum += n * best_tflops
                if best_backend.value == row.backend or best_tflops <= chosen.median_tflops:
                    on_best += n
                else:
                    switch_to[best_backend.value] += n
    lost = 0.0 if best_sum <= 0 else 1.0 - chosen_sum / best_sum
    return {
        "pods": pods,
        "pods_measured": measured_pods,
        "pods_on_best": on_best,
        "throughput_lost_pct": round(100.0 * lost, 2),
        "best_alternatives": dict(sorted(switch_to.items())),
    }


def situation_rankable(evidence: EvidenceIndex, situation: Situation | None) -> bool:
    """Whether some backend of ``situation`` has the samples and pods to be ranked
    (``eligible``'s rule): else no valid set ranks any, and the pods' regret is not
    measured whatever their assessment."""
    return any(evidence.rankable(stats) for stats in evidence.group(situation).values())


def situation_failing(evidence: EvidenceIndex, situation: Situation | None) -> bool:
    """Whether some backend of ``situation`` has failures noted: an exclusion is only
    ever of those (``measured_failures``)."""
    return any(stats.failures for stats in evidence.group(situation).values())


def exclusions_by_cluster(
    fleet: FleetSnapshot,
    inputs: DecisionInputs,
    *,
    now: datetime,
    inputs_for: InputsFor | None = None,
    deadline: Deadline | None = None,
) -> dict[str, dict[str, MeasuredExclusion]]:
    """Per cluster, the backends that failure evidence excludes for its pods under
    policy ``measured``, with why (who failed, when, with what), as data. The summary and
    the dashboard show it, so an exclusion is never a silent gap."""
    classes = ClassCache()
    memo = DecisionMemo(now, classes)
    inputs_for = per_model(inputs_for)
    out = {}
    for cluster, groups in sorted(fleet.by_cluster.items()):
        found = cluster_exclusions(
            groups,
            inputs,
            now=now,
            inputs_for=inputs_for,
            deadline=deadline,
            classes=classes,
            memo=memo,
        )
        if found:
            out[cluster] = found
    return out


def cluster_exclusions(
    groups: Sequence[PodGroup],
    inputs: DecisionInputs,
    *,
    now: datetime,
    inputs_for: InputsFor | None = None,
    deadline: Deadline | None = None,
    classes: ClassCache | None = None,
    memo: DecisionMemo | None = None,
    failing: Sequence[PodGroup] | None = None,
) -> dict[str, MeasuredExclusion]:
    """One cluster's exclusions (``exclusions_by_cluster``'s entry; empty: none).
    ``failing``: those of ``groups`` (in their order) whose situation has failures
    noted in the evidence they trust, when the caller keeps them (``parts.Telling``):
    an exclusion is only ever of those, so only these are read."""
    classes = classes or ClassCache()
    memo = memo or DecisionMemo(now, classes)
    inputs_for = per_model(inputs_for)
    out: dict[str, MeasuredExclusion] = {}
    seen: set[Any] = set()
    measured: dict[str, bool] = {}  # per model: whether policy measured may apply
    for group in each_group(groups if failing is None else failing, deadline):
        request = group.request
        if request is None:
            continue
        model = classes.model_key(request, inputs.overrides)
        found = measured.get(model)
        if found is None:
            applicable = classes.applicable(request, inputs.overrides, now)
            found = measured[model] = any(o.policy == "measured" for o in applicable)
        if not found:
            continue  # failure evidence excludes only under policy measured
        narrowed = inputs if inputs_for is None else inputs_for(request, inputs, now)
        if not memo.of_situation(situation_failing, narrowed.evidence, group.shape_id, request):
            continue  # no failure in the situation: nothing to exclude, no assessment needed
        for stage in classes.stages(request, inputs.overrides, now):
            assessed = _assessed(memo, request, group, stage, inputs, narrowed, now)
            if assessed.policy != "measured" or assessed.situation is None:
                continue
            if assessed.situation in seen:
                continue
            seen.add(assessed.situation)
            for backend, cause in assessed.exclusions.items():
                out.setdefault(backend.value, cause)
    return dict(sorted(out.items()))


def _assessed(
    memo: DecisionMemo,
    request: SelectRequest,
    group: PodGroup,
    stage: StageClass,
    inputs: DecisionInputs,
    narrowed: DecisionInputs,
    now: datetime,
) -> Assessment:
    """``assess`` of one group and stage class, shared through ``memo`` with every
    cluster that decides it alike (the regret and the exclusions ask the same)."""
    return memo.assessment(request, group.shape_id, stage, inputs, narrowed)
