"""Impact preview: replay a proposed rules or override change against every pod's
latest recorded decision, without changing anything.

"From" is what each pod runs now (its recorded backend); "to" is what the same
request would get under the proposal. Pods the proposal would refuse outright
(a strict request that is no longer valid, or nothing valid at all) are reported
as invalid with the reason. Requests are replayed exactly as the pods sent them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from service.decision.engine import Decision, Refusal, decide
from service.schemas import Override, RulesDocument, SelectRequest
from service.selector import decision_key
from service.store.repo import PodState


class Preview(BaseModel):
    pods_total: int
    pods_changed: int
    pods_invalid: int
    changes: list[dict[str, Any]]
    invalid: list[dict[str, Any]]
    clusters_affected: list[str]
    pods_unreadable: int = 0


def replay(
    pods: Sequence[PodState],
    rules: RulesDocument,
    overrides: Sequence[Override],
    *,
    now: datetime,
) -> Preview:
    changes: Counter[tuple[str, str, str]] = Counter()
    invalid: Counter[tuple[str, str, str]] = Counter()
    cache: dict[tuple[Any, ...], Decision | Refusal] = {}
    unreadable = 0
    for pod in pods:
        try:
            request = SelectRequest.model_validate_json(pod.request_json)
        except ValidationError:
            unreadable += 1  # recorded under an older schema; cannot be replayed
            continue
        key = decision_key(request)
        result = cache.get(key)
        if result is None:
            result = cache[key] = decide(request, rules, overrides, now=now)
        if isinstance(result, Refusal):
            invalid[(pod.cluster, pod.backend, result.message)] += 1
        elif result.backend.value != pod.backend:
            changes[(pod.cluster, pod.backend, result.backend.value)] += 1
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
