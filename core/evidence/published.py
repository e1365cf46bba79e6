"""Reads of an evidence index's published summaries: what every decision asks (which
backends failures exclude, which have enough samples, the measured winner), without a
lock, from the mappings a write replaces with one assignment."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core import cause_words
from mla_switchboard.core.causes import FailuresBelowPolicy
from mla_switchboard.core.evidence.observations import FailureNote, FailurePolicy
from mla_switchboard.core.evidence.situations import Situation
from mla_switchboard.core.evidence.stats import NO_GROUP, BackendStats, Group
from mla_switchboard.core.schemas import Evidence
from mla_switchboard.core.specs import Backend

__all__ = ["PublishedEvidence"]


_TABLE_ORDER = {b: i for i, b in enumerate(Backend)}
"""Each backend's place in the table: how ties in speed are ranked."""


class PublishedEvidence:
    """The published side of an :class:`~mla_switchboard.core.evidence.EvidenceIndex`:
    per situation, an immutable mapping of each backend's :class:`BackendStats`, and
    the thresholds and failure policy that turn them into a ranking or an exclusion.
    The index's writer replaces a situation's mapping whole (under ``_lock``, which a
    read here takes only to copy the mapping of every situation)."""

    __slots__ = ("_lock", "_published", "_version", "failure_policy", "min_pods", "min_samples")

    def __init__(
        self, *, min_samples: int, min_pods: int, failure_policy: FailurePolicy | None
    ) -> None:
        self.min_samples = min_samples
        self.min_pods = min_pods
        self.failure_policy = failure_policy or FailurePolicy()
        self._lock = threading.Lock()
        self._published: dict[Situation, Group] = {}
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def group(self, situation: Situation | None) -> Group:
        if situation is None:
            return NO_GROUP
        return self._published.get(situation, NO_GROUP)

    def exclusions(
        self,
        situation: Situation | None,
        now: datetime,
        shown: Callable[[str], bool] | None = None,
    ) -> dict[Backend, str]:
        """Backends the failure policy excludes in ``situation``, with the reason
        (quoting the pods of the clusters ``shown`` accepts; None: every cluster)."""
        out: dict[Backend, str] = {}
        for backend, stats in self.group(situation).items():
            if stats.failures:
                reason = self.failure_policy.exclusion_of_latest(stats.failures, now, shown)
                if reason is not None:
                    out[backend] = reason
        return out

    def eligible(
        self, situation: Situation | None, valid: Iterable[Backend]
    ) -> list[tuple[Backend, BackendStats]]:
        """Valid backends with enough correct samples, fastest first (ties: table
        order). ``valid`` must already leave out what :meth:`exclusions` excludes."""
        group = self.group(situation)
        order = _TABLE_ORDER
        ranked = [(b, group[b]) for b in valid if b in group and self.rankable(group[b])]
        ranked.sort(key=lambda bs: (-(bs[1].median_tflops or 0.0), order[bs[0]]))
        return ranked

    def rankable(self, stats: BackendStats) -> bool:
        """Whether a backend's figures have the samples and pods to be ranked."""
        return stats.samples >= self.min_samples and stats.pods >= self.min_pods

    def rank(self, situation: Situation | None, valid: Iterable[Backend]) -> Evidence | None:
        """The measured winner among ``valid``, or None when the evidence is too thin."""
        ranked = self.eligible(situation, valid)
        if not ranked:
            return None
        (best, stats), runner = ranked[0], ranked[1] if len(ranked) > 1 else None
        best_tflops = stats.median_tflops or 0.0
        runner_tflops = None if runner is None else runner[1].median_tflops
        return Evidence(
            backend=best,
            median_tflops=round(best_tflops, 3),
            samples=stats.samples,
            pods=stats.pods,
            runner_up=None if runner is None else runner[0],
            runner_up_tflops=None if runner_tflops is None else round(runner_tflops, 3),
            margin=None
            if not runner_tflops
            else round((best_tflops - runner_tflops) / runner_tflops, 4),
        )

    def _below_policy(
        self, backend: Backend, failures: Sequence[FailureNote], now: datetime
    ) -> str | None:
        """What failures from fewer pods than the policy needs do, in words (the
        console shows it where exclusions are); None when none is within the window."""
        policy = self.failure_policy
        recent = policy.recent(failures, now)
        if not recent:
            return None
        cause = FailuresBelowPolicy(
            backend=backend.value,
            pods=recent,
            needed=policy.min_pods,
            window_h=policy.window.total_seconds() / 3600,
        )
        return cause_words.notice(cause)

    def summary(
        self, now: datetime | None = None, shown: Callable[[str], bool] | None = None
    ) -> list[dict[str, Any]]:
        """Every situation and backend's figures; exclusion reasons quote the pods of
        the clusters ``shown`` accepts (None: every cluster) and count the others."""
        now = now or datetime.now(UTC)
        with self._lock:
            published = dict(self._published)
        out = []
        for situation in sorted(published):
            excluded = self.exclusions(situation, now, shown)
            for backend, stats in sorted(published[situation].items()):
                median = stats.median_tflops
                out.append(
                    {
                        "device": situation.device,
                        "capability": situation.capability,
                        "dims": [int(x) for x in situation.dims.split(",")],
                        "dtype": situation.dtype,
                        "engine": situation.engine,
                        "backend": backend.value,
                        "impls": sorted(stats.impls),
                        "packages": json.loads(situation.packages),
                        "samples": stats.samples,
                        "pods": stats.pods,
                        "failures": len(stats.failures),
                        "excluded": excluded.get(backend),
                        "not_excluded": None
                        if backend in excluded or not stats.failures
                        else self._below_policy(backend, stats.failures, now),
                        "median_tflops": None if median is None else round(median, 3),
                    }
                )
        return out
