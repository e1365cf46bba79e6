"""Regret: the prefill throughput a cluster leaves on the table with its current choices.

For every pod whose situation has measured evidence, compare the median TFLOP/s of the
backend it runs with the best *valid* backend measured for that situation (valid for
that pod, overrides' denies included). Per cluster the figure is
``1 - sum(chosen) / sum(best)`` over those pods: the share of attention-prefill
throughput lost, as a fleet operator would add it up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from mla_switchboard.core.evaluator import DecisionInputs, assess
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.selector import InputsFor
from mla_switchboard.service.state import PodState


def regret_by_cluster(
    pods: Sequence[PodState],
    inputs: DecisionInputs,
    *,
    now: datetime,
    inputs_for: InputsFor | None = None,
) -> dict[str, dict[str, Any]]:
    """Per cluster: pods, pods measured, pods on their best backend, the share of
    throughput lost and the best alternatives. Validity comes from the evaluator's
    ``assess`` (spec, engine, denies and, under policy measured, failure evidence)."""
    fleet_inputs = inputs
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
    for pod in pods:
        a = acc[pod.cluster]
        a["pods"] += 1
        request = pod.request
        if request is None:
            continue
        if inputs_for is not None:
            inputs = inputs_for(request, fleet_inputs, now)
        evidence = inputs.evidence
        assessed = assess(request, inputs, now)
        if assessed.situation is None:
            continue
        try:
            chosen = evidence.group(assessed.situation).get(Backend(pod.backend))
        except ValueError:
            continue
        if chosen is None or chosen.median_tflops is None:
            continue
        ranked = evidence.eligible(assessed.situation, assessed.valid())
        if not ranked:
            continue
        best_backend, best = ranked[0]
        best_tflops = max(best.median_tflops or 0.0, chosen.median_tflops)
        a["pods_measured"] += 1
        a["chosen"] += chosen.median_tflops
        a["best"] += best_tflops
        if best_backend.value == pod.backend or best_tflops <= chosen.median_tflops:
            a["pods_on_best"] += 1
        else:
            a["switch_to"][best_backend.value] += 1
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
    pods: Sequence[PodState],
    inputs: DecisionInputs,
    *,
    now: datetime,
    inputs_for: InputsFor | None = None,
) -> dict[str, dict[str, str]]:
    """Per cluster, the backends that failure evidence excludes for its pods under
    policy ``measured``, with the reason (who failed, when, with what). The summary and
    the dashboard show it, so an exclusion is never a silent gap."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    seen: set[tuple[str, Any]] = set()
    for pod in pods:
        request = pod.request
        if request is None:
            continue
        narrowed = inputs if inputs_for is None else inputs_for(request, inputs, now)
        assessed = assess(request, narrowed, now)
        key = (pod.cluster, assessed.situation)
        if assessed.policy != "measured" or assessed.situation is None or key in seen:
            continue
        seen.add(key)
        for backend, reason in narrowed.evidence.exclusions(assessed.situation, now).items():
            out[pod.cluster].setdefault(backend.value, reason)
    return {cluster: dict(sorted(v.items())) for cluster, v in sorted(out.items())}
