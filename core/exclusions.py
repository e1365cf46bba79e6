"""Which backends the failure policy excludes in a situation, and why, as data.

The evidence index keeps each backend's failing pods (their newest note, newest first);
this module reads them into :class:`~mla_switchboard.core.causes.MeasuredExclusion`
values, which every answer carries and each caller reads in its own words
(``core/cause_words.py``): the pods and errors are other clusters' as often as the
reader's, since a cluster may trust other clusters' evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from mla_switchboard.core.causes import (
    FailuresBelowPolicy,
    MeasuredExclusion,
    PodError,
    first_line,
)
from mla_switchboard.core.evidence import EvidenceIndex, FailureNote, FailurePolicy, Situation
from mla_switchboard.core.specs import Backend

QUOTED = 3
"""How many of the newest failing pods an exclusion quotes."""


def measured_exclusions(
    index: EvidenceIndex, situation: Situation | None, now: datetime
) -> dict[Backend, MeasuredExclusion]:
    """Backends the failure policy excludes in ``situation`` at ``now``, with why."""
    return measured_failures(index, situation, now)[0]


def measured_failures(
    index: EvidenceIndex, situation: Situation | None, now: datetime
) -> tuple[dict[Backend, MeasuredExclusion], dict[Backend, FailuresBelowPolicy]]:
    """Backends the failure policy excludes in ``situation`` at ``now``, with why; and
    those that failed on fewer pods within the window than the policy needs (valid
    still, and the answer says how far from excluded they are)."""
    out: dict[Backend, MeasuredExclusion] = {}
    below: dict[Backend, FailuresBelowPolicy] = {}
    policy = index.failure_policy
    for backend, stats in index.group(situation).items():
        if stats.failures:
            found = exclusion_of_latest(policy, stats.failures, now)
            if found is not None:
                out[backend] = found
                continue
            recent = policy.recent(stats.failures, now)
            if recent:
                below[backend] = FailuresBelowPolicy(
                    backend=backend.value,
                    pods=recent,
                    needed=policy.min_pods,
                    window_h=policy.window.total_seconds() / 3600,
                )
    return out, below


def exclusion_of_latest(
    policy: FailurePolicy, latest: Sequence[FailureNote], now: datetime
) -> MeasuredExclusion | None:
    """Why ``latest`` (one note per pod, newest first) excludes its backend, or None:
    a binary search finds the pods within the window, so a decision never walks every
    failing pod."""
    recent = policy.recent(latest, now)
    if recent == 0 or recent < policy.min_pods:
        return None
    kept = _kept.get(id(latest))
    if kept is not None and kept[0] is latest and kept[1] == (recent, policy):
        return kept[2]
    quoted = [
        PodError(cluster=n.cluster, pod=n.pod, at=n.at, error=first_line(n.error))
        for n in latest[: min(recent, QUOTED)]
    ]
    hours = policy.window.total_seconds() / 3600
    found = MeasuredExclusion(pods=recent, window_h=hours, quoted=quoted)
    if len(_kept) >= KEPT:
        _kept.clear()
    _kept[id(latest)] = (latest, (recent, policy), found)
    return found


KEPT = 4096
"""How many backends' exclusions are kept. A backend's failing pods are published as a
tuple replaced on every change, so one read of it gives the same exclusion while the
same pods are within the window: a fleet read deciding thousands of groups of one
situation builds it once. Kept by the tuple itself (its id, checked by identity)."""
_kept: dict[int, tuple[Sequence[FailureNote], tuple[int, FailurePolicy], MeasuredExclusion]] = {}
