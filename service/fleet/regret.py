"""Regret: the prefill throughput a cluster leaves on the table with its current choices.

For every pod whose situation has measured evidence, compare the median TFLOP/s of the
backend it runs with the best *valid* backend measured for that situation (valid for
that pod, overrides' denies included). Per cluster the figure is
``1 - sum(chosen) / sum(best)`` over those pods: the share of attention-prefill
throughput lost, as a fleet operator would add it up. Pods are taken by group
(``service/fleet/groups.py``): one assessment per cluster, shape and stage class.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from mla_switchboard.core.evaluator import DecisionInputs, applicable_overrides, assess
from mla_switchboard.core.evidence import situation_of
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.fleet.groups import ClassCache, Deadline, FleetSnapshot, each_group
from mla_switchboard.service.fleet.groups import partial_rollouts as _partials
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
    acc: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "pods": 0,
            "pods_measured": 0,
            "pods_on_best": 0,
            "chosen": 0.0,
            "best": 0.0,
            "switch_to": defaultdict(int),
        }
    )
    classes = ClassCache()
    for group in each_group(fleet, deadline):
        a = acc[group.cluster]
        a["pods"] += group.pods
        request = group.request
        if request is None:
            continue
        narrowed = inputs if inputs_for is None else inputs_for(request, inputs, now)
        evidence = narrowed.evidence
        if not evidence.group(situation_of(request)):
            continue  # nothing measured for these pods: no assessment needed
        for stage in classes.of(_partials(request, inputs.overrides, now)):
            assessed = assess(request, narrowed, now, stage.bucket)
            if assessed.situation is None:
                break
            measured = evidence.group(assessed.situation)
            ranked = evidence.eligible(assessed.situation, assessed.valid())
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
                a["pods_measured"] += n
                a["chosen"] += n * chosen.median_tflops
                a["best"] += n * best_tflops
                if best_backend.value == row.backend or best_tflops <= chosen.median_tflops:
                    a["pods_on_best"] += n
                else:
                    a["switch_to"][best_backend.value] += n
    out: dict[str, dict[str, Any]] = {}
    for cluster, a in sorted(acc.items()):
        lost = 0.0 if a["best"] <= 0 else 1.0 - a["chosen"] / a["best"]
        out[cluster] = {
            "pods": a["pods"],
            "pods_measured": a["pods_measured"],
            "pods_on_best": a["pods_on_best"],
            "throughput_lost_pct": round(100.0 * lost, 2),
            "best_alternatives": dict(sorted(a["switch_to"].items())),
        }
    return out


def exclusions_by_cluster(
    fleet: FleetSnapshot,
    inputs: DecisionInputs,
    *,
    now: datetime,
    inputs_for: InputsFor | None = None,
    deadline: Deadline | None = None,
) -> dict[str, dict[str, str]]:
    """Per cluster, the backends that failure evidence excludes for its pods under
    policy ``measured``, with the reason (who failed, when, with what). The summary and
    the dashboard show it, so an exclusion is never a silent gap."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    seen: set[tuple[str, Any]] = set()
    classes = ClassCache()
    for group in each_group(fleet, deadline):
        request = group.request
        if request is None:
            continue
        applicable = applicable_overrides(request, inputs.overrides, now)
        if not any(o.policy == "measured" for o in applicable):
            continue  # failure evidence excludes only under policy measured
        narrowed = inputs if inputs_for is None else inputs_for(request, inputs, now)
        for stage in classes.of(_partials(request, inputs.overrides, now)):
            assessed = assess(request, narrowed, now, stage.bucket)
            key = (group.cluster, assessed.situation)
            if assessed.policy != "measured" or assessed.situation is None or key in seen:
                continue
            seen.add(key)
            for backend, reason in narrowed.evidence.exclusions(assessed.situation, now).items():
                out[group.cluster].setdefault(backend.value, reason)
    return {cluster: dict(sorted(v.items())) for cluster, v in sorted(out.items())}
