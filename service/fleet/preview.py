"""Impact preview: replay a proposed rules or override change against what every pod
runs now, without changing anything.

Each group of pods (cluster, request shape, stage class: see ``service/fleet/groups.py``) is
decided twice, exactly as its pods asked: under the config in force ("from") and under
the proposal ("to"), so the counts say what *this* change does, not what earlier
changes already did to pods that have not rebooted since (those are counted apart as
``pods_pending``: their recorded backend differs from what the config in force gives
them). Pods the proposal would refuse outright (a strict request that is no longer
valid, or nothing valid at all) are reported as invalid with the reason. One group is
decided once per stage class whatever its number of pods, so a preview of the whole
fleet costs O(clusters x situations).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from mla_switchboard.core.evaluator import Decision, DecisionInputs, Refusal, decide
from mla_switchboard.core.schemas import Override
from mla_switchboard.service.fleet.groups import (
    ClassCache,
    Deadline,
    DecisionMemo,
    FleetSnapshot,
    StageClass,
    each_group,
    partial_rollouts,
)
from mla_switchboard.service.selector import InputsFor
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
    fleet: FleetSnapshot,
    current: DecisionInputs,
    proposed: DecisionInputs,
    *,
    now: datetime,
    inputs_for: InputsFor | None = None,
    deadline: Deadline | None = None,
) -> Preview:
    """Count what changes from ``current`` to ``proposed`` for every pod of ``fleet``.

    Both sides are full ``DecisionInputs``, evidence included, and go through the same
    evaluator as ``/v1/select``: a preview of a ``measured`` policy sees the evidence
    the live path will use."""
    changes: Counter[tuple[str, str, str]] = Counter()
    invalid: Counter[tuple[str, str, str]] = Counter()
    unreadable = pending = total = 0
    classes = ClassCache()
    memo = DecisionMemo(now)

    def under(inputs: DecisionInputs, request: Any, bucket: int | None) -> Decision | Refusal:
        narrowed = inputs if inputs_for is None else inputs_for(request, inputs, now)
        return decide(request, narrowed, now=now, bucket=bucket)

    def both(request: Any, shape_id: str, stage: StageClass) -> tuple[Any, Any]:
        key = memo.key(request, shape_id, stage, current, proposed)
        return memo.get(
            key,
            lambda: (under(current, request, stage.bucket), under(proposed, request, stage.bucket)),
        )

    for group in each_group(fleet, deadline):
        total += group.pods
        request = group.request
        if request is None:
            unreadable += group.pods  # recorded under an older schema; cannot be replayed
            continue
        staged = _union(
            partial_rollouts(request, current.overrides, now),
            partial_rollouts(request, proposed.overrides, now),
        )
        for stage in classes.of(staged):
            before, after = both(request, group.shape_id, stage)
            for row in group.rows:
                n = stage.count(row)
                if not n:
                    continue
                was = row.backend if isinstance(before, Refusal) else before.backend.value
                if was != row.backend:
                    pending += n
                if isinstance(after, Refusal):
                    if not isinstance(before, Refusal):
                        invalid[(group.cluster, was, after.message)] += n
                elif after.backend.value != was:
                    changes[(group.cluster, was, after.backend.value)] += n
    affected = sorted({c for c, _, _ in changes} | {c for c, _, _ in invalid})
    return Preview(
        pods_total=total,
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


def _union(a: Sequence[Override], b: Sequence[Override]) -> tuple[Override, ...]:
    seen = {id(o) for o in a}
    return (*a, *(o for o in b if id(o) not in seen))


def with_override(
    overrides: Sequence[Override], cluster: str, proposed: Override | None
) -> list[Override]:
    """The override set with ``cluster``'s entry replaced (or removed when None)."""
    out = [o for o in overrides if o.cluster != cluster]
    if proposed is not None:
        out.append(proposed)
    return out
