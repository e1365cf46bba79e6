"""What a write to an evidence index publishes: immutable per-backend summaries that
every decision reads without a lock."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from mla_switchboard.core.evidence.observations import FailureNote
from mla_switchboard.core.specs import Backend


@dataclass(frozen=True)
class BackendStats:
    """What the fleet measured for one backend in one situation: a summary that a
    write to the index publishes and nothing changes afterwards.

    ``samples`` and ``pods`` count only what counts (each pod's ``per_pod`` most recent
    correct results); ``failures`` holds each failing pod's newest note, newest first.
    """

    median_tflops: float | None = None
    samples: int = 0
    pods: int = 0
    impls: frozenset[str] = frozenset()
    failures: tuple[FailureNote, ...] = ()


Group = Mapping[Backend, BackendStats]
PodSample = tuple[str, str, float]
"""(cluster, pod, TFLOP/s) of one counted sample"""


NO_GROUP: Group = MappingProxyType({})
