"""What a pod contributes to the evidence: a measured result or a failure
(:class:`Observation`), where it comes from (its source, so a replica counts a stored
report once), and when failures exclude a backend (:class:`FailurePolicy`)."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from mla_switchboard.core.evidence.records import failure_key
from mla_switchboard.core.evidence.situations import Situation, situation_from, situation_of
from mla_switchboard.core.schemas import MeasurementReport, SelectRequest
from mla_switchboard.core.specs import Backend


@dataclass(frozen=True)
class Observation:
    """One measured result or one reported failure, already keyed by situation."""

    situation: Situation
    backend: str
    pod: str
    tflops: float | None
    ok: bool
    cluster: str = ""
    at: datetime | None = None
    error: str | None = None
    impl: str | None = None
    source: str = ""  # the stored report it comes from, so a reload can tell it apart


@dataclass(frozen=True)
class FailureNote:
    """One failing pod's report, as an exclusion reason quotes it."""

    cluster: str
    pod: str
    at: datetime | None
    error: str

    def describe(self) -> str:
        where = f"{self.cluster}/{self.pod}" if self.cluster else (self.pod or "a pod")
        when = (
            "" if self.at is None else " " + self.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
        )
        first_line = (self.error.strip().splitlines() or ["no error text"])[0][:200]
        return f"{where}{when}: {first_line}"


@dataclass(frozen=True)
class FailurePolicy:
    """When failures exclude a backend from measured selection.

    A backend is excluded for a situation while at least ``min_pods`` distinct pods
    reported a failure (failed build or wrong result) within the last ``window``.
    Older failures expire by themselves; an admin can clear a situation's failures.
    Two pods by default: one pod's wrong result (a bad GPU, a flaky run) would
    otherwise take the backend from every pod of the situation for the whole window.
    Failures never leave a pod with no valid backend (``core/evaluator.py``).
    """

    min_pods: int = 2
    window: timedelta = timedelta(hours=24)

    def describe(self) -> str:
        hours = self.window.total_seconds() / 3600
        pods = "1 pod" if self.min_pods == 1 else f"{self.min_pods} pods"
        return f"failures from at least {pods} within {hours:g} h exclude a backend"

    def recent(self, latest: Sequence[FailureNote], now: datetime) -> int:
        """How many of ``latest`` (one note per pod, newest first) are within the
        window: a binary search, never a walk of every failing pod."""
        since = -(now - self.window).timestamp()
        return bisect.bisect_right(latest, since, key=lambda f: -failure_key(f.at))

    def exclusion(self, failures: Sequence[FailureNote], now: datetime) -> str | None:
        """The reason ``failures`` (any notes, several per pod allowed) exclude their
        backend at ``now``, or None."""
        latest: dict[tuple[str, str], FailureNote] = {}
        for f in failures:
            known = latest.get((f.cluster, f.pod))
            if known is None or failure_key(f.at) >= failure_key(known.at):
                latest[(f.cluster, f.pod)] = f
        newest_first = sorted(latest.values(), key=lambda f: failure_key(f.at), reverse=True)
        return self.exclusion_of_latest(newest_first, now)

    def exclusion_of_latest(
        self,
        latest: Sequence[FailureNote],
        now: datetime,
        shown: Callable[[str], bool] | None = None,
    ) -> str | None:
        """As :meth:`exclusion`, for one note per pod, newest first (what
        :attr:`BackendStats.failures` holds): a binary search finds the pods within the
        window, so a decision never walks every failing pod. ``shown``: the clusters
        whose pods the reader may see quoted; the others' pods are only counted (a
        reader limited to some clusters learns that a backend is excluded and by how
        many pods elsewhere, never their names or errors)."""
        recent = self.recent(latest, now)
        if recent == 0 or recent < self.min_pods:
            return None
        hidden = 0
        quoted: Sequence[FailureNote]
        if shown is None:  # a decision's reason: never walks every failing pod
            quoted, quotable = latest[: min(recent, 3)], recent
        else:
            mine = [n for n in latest[:recent] if shown(n.cluster)]
            quoted, quotable, hidden = mine[:3], len(mine), recent - len(mine)
        parts = [n.describe() for n in quoted]
        if quotable > 3:
            parts.append(f"and {quotable - 3} more")
        if hidden:
            parts.append(f"{_pods(hidden)} in clusters outside your scope")
        hours = self.window.total_seconds() / 3600
        return f"failed on {_pods(recent)} in the last {hours:g} h (measured policy): " + (
            "; ".join(parts)
        )


def _pods(n: int) -> str:
    return "1 pod" if n == 1 else f"{n} pods"


def backend_of(name: str) -> Backend | None:
    try:
        return Backend(name)
    except ValueError:
        return None


def observations_of_report(
    report: MeasurementReport, at: datetime | None = None, report_id: str | None = None
) -> list[Observation]:
    """The observations a measurement report contributes (none without a GPU); each
    names its source (``report_id`` and the result's index): the store's read names the
    same report (:func:`report_key`), so a replica counts it once."""
    cap = report.device.capability
    if cap is None:
        return []
    situation = situation_from(report, cap, report.packages)
    return [
        Observation(
            situation=situation,
            backend=r.backend.value,
            pod=report.pod,
            tflops=r.tflops,
            ok=r.correct and r.error is None,
            cluster=report.cluster,
            at=at,
            error=r.error if r.error is not None else (None if r.correct else "wrong result"),
            impl=r.impl,
            source="" if report_id is None else measurement_source(report_id, i),
        )
        for i, r in enumerate(report.results)
    ]


def measurement_source(report_id: str, index: int) -> str:
    """One result's source: its report, and its place in it (or its stored row's id)."""
    return f"m:{report_id}:{index}"


def report_key(source: str) -> str:
    """What tells one stored report from another: a measurement's report (all its
    results are stored and applied together), or a failure's own source."""
    if source.startswith("m:"):
        return source.rsplit(":", 1)[0]
    return source


def failure_source(decision_id: str, backend: str, error: str) -> str:
    digest = hashlib.blake2b(error.encode(), digest_size=6).hexdigest()
    return f"f:{decision_id}:{backend}:{digest}"


def failure_observation(
    request: SelectRequest,
    backend: str,
    error: str,
    at: datetime | None,
    pod: str | None,
    decision_id: str = "",
) -> Observation | None:
    """A failure a pod reported for its decision, keyed by that pod's situation."""
    situation = situation_of(request)
    if situation is None:
        return None
    return Observation(
        situation,
        backend,
        pod or "",
        None,
        ok=False,
        cluster=request.cluster,
        at=at,
        error=error,
        source=failure_source(decision_id, backend, error) if decision_id else "",
    )
