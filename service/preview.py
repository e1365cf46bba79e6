"""Impact preview: replay a proposed rules or override change against every pod's
latest recorded decision, without changing anything.

Each pod's latest request is replayed twice, exactly as the pod sent it: under the
config in force ("from") and under the proposal ("to"), so the counts say what *this*
change does, not what earlier changes already did to pods that have not rebooted since
(those are counted apart as ``pods_pending``: their recorded backend differs from what
the config in force gives them). Pods the proposal would refuse outright (a strict
request that is no longer valid, or nothing valid at all) are reported as invalid with
the reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from mla_switchboard.core.evaluator import Decision, DecisionInputs, Refusal, decide, decision_key
from mla_switchboard.core.schemas import Override, SelectRequest
from mla_switchboard.service.selector import InputsFor
from mla_switchboard.service.state import PodState
from pydantic import BaseModel


class Preview(BaseModel):
    pods_total: int
    pods_changed: int
    pods_invalid: int
    changes: list[dict[str, Any]]
    invalid: list[dict[str, Any]]
    clusters_affected: list[str]
    pods_pending: int = 0
    pods_unreadable: int = 0


def replay(
    pods: Sequence[PodState],
    current: DecisionInputs,
    proposed: DecisionInputs,
    *,
    now: datetime,
    inputs_for: InputsFor | None = None,
) -> Preview:
    """Count what changes from ``current`` to ``proposed`` for each pod's latest request.

    Both sides are full ``DecisionInputs``, evidence included, and go through the same
    evaluator as ``/v1/select``: a preview of a ``measured`` policy sees the evidence
    the live path will use."""
    changes: Counter[tuple[str, str, str]] = Counter()
    invalid: Counter[tuple[str, str, str]] = Counter()
    caches: tuple[dict[tuple[Any, ...], Decision | Refusal], ...] = ({}, {})
    unreadable = pending = 0

    def under(index: int, inputs: DecisionInputs, request: SelectRequest) -> Decision | Refusal:
        key = decision_key(request, inputs.overrides)
        if key not in caches[index]:
            narrowed = inputs if inputs_for is None else inputs_for(request, inputs, now)
            caches[index][key] = decide(request, narrowed, now=now)
        return caches[index][key]

    for pod in pods:
        request = pod.request
        if request is None:
            unreadable += 1  # recorded under an older schema; cannot be replayed
            continue
        before, after = under(0, current, request), under(1, proposed, request)
        was = pod.backend if isinstance(before, Refusal) else before.backend.value
        pending += was != pod.backend
        if isinstance(after, Refusal):
            if not isinstance(before, Refusal):
                invalid[(pod.cluster, was, after.message)] += 1
        elif after.backend.value != was:
            changes[(pod.cluster, was, after.backend.value)] += 1
    affected = sorted({c for c, _, _ in changes} | {c for c, _, _ in invalid})
    return Preview(
        pods_total=len(pods),
        pods_changed=sum(changes.values()),
        pods_invalid=sum(invalid.values()),
        changes=[
            {"cluster": c, "from": f, "to": t, "pods": n}
            for (c, f, t), n in sorted(changes.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0]))
        ],
        invalid=[
            {"cluster": c, "from": f, "reason": r, "pods": n}
            for (c, f, r), n in sorted(invalid.items())
        ],
        clusters_affected=affected,
        pods_pending=pending,
        pods_unreadable=unreadable,
    )


def with_override(
    overrides: Sequence[Override], cluster: str, proposed: Override | None
) -> list[Override]:
    """The override set with ``cluster``'s entry replaced (or removed when None)."""
    out = [o for o in overrides if o.cluster != cluster]
    if proposed is not None:
        out.append(proposed)
    return out
