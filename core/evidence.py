"""Measured selection: the fleet's own benchmarks and failures, per exact situation.

A *situation* is what decides which kernel is fastest and whether it works: device
name, compute capability, MLA dims, dtype, the versions of the kernel packages and the
serving engine (vLLM's FLASH_ATTN is vLLM's bundled FlashAttention 3, not the FA2 that
PyTorch bundles, so the two are never compared as one). Evidence counts only for its
own situation.

Failures (a kernel that failed to build, or gave a wrong result) exclude a backend
under a stated :class:`FailurePolicy`: by default one failing pod within 24 hours. They
expire with the window and an admin can clear them; every exclusion is a reason the
answer shows ("failed on 2 pods in the last 24 h: staging/pod-a 2026-11-30 15:37 UTC:
..."), never a silent gap.

An :class:`EvidenceIndex` is immutable: new observations give a new index
(:meth:`EvidenceIndex.with_observations`), which the service swaps in atomically.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from mla_switchboard.core.schemas import EngineInfo, Evidence, MeasurementReport, SelectRequest
from mla_switchboard.core.specs import Backend

__all__ = [
    "KERNEL_PACKAGES",
    "BackendStats",
    "EvidenceIndex",
    "FailureNote",
    "FailurePolicy",
    "Observation",
    "Situation",
    "dims_key",
    "engine_key",
    "failure_observation",
    "observations_of_report",
    "packages_key",
    "situation_of",
]

KERNEL_PACKAGES = ("torch", "flash_attn", "flashinfer", "cudnn", "tokenspeed_mla")
"""Only these packages' versions change kernel speed; others don't split the evidence."""


@dataclass(frozen=True, order=True)
class Situation:
    device: str
    capability: str
    dims: str
    dtype: str
    packages: str  # canonical JSON of the kernel packages' versions
    engine: str = "switchboard"  # engine_key(): "switchboard" or "vllm 0.33.0"


def packages_key(packages: Mapping[str, str]) -> str:
    return json.dumps(
        {k: packages[k] for k in KERNEL_PACKAGES if k in packages},
        sort_keys=True,
        separators=(",", ":"),
    )


def dims_key(qk_nope: int, qk_rope: int, v: int) -> str:
    return f"{qk_nope},{qk_rope},{v}"


def engine_key(engine: EngineInfo | None) -> str:
    """The engine part of a situation: its name and exact version (a code path can
    change between releases), ``switchboard`` for our own wrappers."""
    if engine is None or engine.name == "switchboard":
        return "switchboard"
    return f"{engine.name} {engine.version or '?'}"


def situation_of(request: SelectRequest) -> Situation | None:
    """None when the request cannot be matched exactly: no GPU, or packages unknown."""
    cap = request.device.capability
    if cap is None or request.packages is None:
        return None
    m = request.model
    return Situation(
        device=request.device.name or "",
        capability=f"{cap[0]}.{cap[1]}",
        dims=dims_key(m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
        dtype=request.dtype.value,
        packages=packages_key(request.packages),
        engine=engine_key(request.engine),
    )


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
    """

    min_pods: int = 1
    window: timedelta = timedelta(hours=24)

    def describe(self) -> str:
        hours = self.window.total_seconds() / 3600
        pods = "1 pod" if self.min_pods == 1 else f"{self.min_pods} pods"
        return f"failures from at least {pods} within {hours:g} h exclude a backend"

    def exclusion(self, failures: Sequence[FailureNote], now: datetime) -> str | None:
        """The reason ``failures`` exclude their backend at ``now``, or None."""
        since = now - self.window
        recent = [f for f in failures if f.at is None or f.at >= since]
        latest: dict[str, FailureNote] = {}
        for f in sorted(recent, key=lambda f: f.at or datetime.min.replace(tzinfo=UTC)):
            latest[f"{f.cluster}/{f.pod}"] = f
        if not latest or len(latest) < self.min_pods:
            return None
        notes = sorted(latest.values(), key=lambda f: f.at or now, reverse=True)
        shown = "; ".join(n.describe() for n in notes[:3])
        more = "" if len(notes) <= 3 else f"; and {len(notes) - 3} more"
        hours = self.window.total_seconds() / 3600
        pods = "1 pod" if len(notes) == 1 else f"{len(notes)} pods"
        return f"failed on {pods} in the last {hours:g} h (measured policy): {shown}{more}"


@dataclass(frozen=True)
class BackendStats:
    """What the fleet measured for one backend in one situation."""

    by_pod: tuple[tuple[str, str, float], ...] = ()  # (cluster, pod, TFLOP/s) per sample
    failures: tuple[FailureNote, ...] = ()
    impls: frozenset[str] = frozenset()

    @property
    def tflops(self) -> tuple[float, ...]:
        return tuple(t for _, _, t in self.by_pod)

    @property
    def pods(self) -> frozenset[str]:
        return frozenset(p for _, p, _ in self.by_pod)

    @property
    def samples(self) -> int:
        return len(self.by_pod)

    @property
    def median_tflops(self) -> float | None:
        return statistics.median(self.tflops) if self.tflops else None

    def plus(self, o: Observation) -> BackendStats:
        if o.ok and o.tflops is not None:
            return replace(
                self,
                by_pod=(*self.by_pod, (o.cluster, o.pod, o.tflops)),
                impls=self.impls | ({o.impl} if o.impl else set()),
            )
        if not o.ok:
            note = FailureNote(o.cluster, o.pod, o.at, o.error or "wrong result or failed build")
            return replace(self, failures=(*self.failures, note))
        return self


Group = Mapping[Backend, BackendStats]


class EvidenceIndex:
    """Evidence per situation and backend. Immutable: build a new one to change it."""

    __slots__ = ("_groups", "failure_policy", "min_pods", "min_samples")

    def __init__(
        self,
        observations: Iterable[Observation] = (),
        *,
        min_samples: int = 3,
        min_pods: int = 2,
        failure_policy: FailurePolicy | None = None,
        _groups: dict[Situation, dict[Backend, BackendStats]] | None = None,
    ) -> None:
        self.min_samples = min_samples
        self.min_pods = min_pods
        self.failure_policy = failure_policy or FailurePolicy()
        self._groups: dict[Situation, dict[Backend, BackendStats]] = dict(_groups or {})
        self._fold(observations, copied=set())

    def _fold(self, observations: Iterable[Observation], copied: set[Situation]) -> None:
        for o in observations:
            try:
                backend = Backend(o.backend)
            except ValueError:
                continue
            if o.situation not in copied:  # copy-on-write: never touch a shared group
                self._groups[o.situation] = dict(self._groups.get(o.situation, {}))
                copied.add(o.situation)
            group = self._groups[o.situation]
            group[backend] = group.get(backend, BackendStats()).plus(o)

    def with_observations(self, observations: Iterable[Observation]) -> EvidenceIndex:
        """A new index with ``observations`` folded in; this one is unchanged."""
        return EvidenceIndex(
            observations,
            min_samples=self.min_samples,
            min_pods=self.min_pods,
            failure_policy=self.failure_policy,
            _groups=self._groups,
        )

    def group(self, situation: Situation | None) -> Group:
        return {} if situation is None else self._groups.get(situation, {})

    def samples(self, situation: Situation, backend: Backend) -> list[tuple[str, str, float]]:
        """(cluster, pod, TFLOP/s) of every counted sample of ``backend`` there."""
        stats = self._groups.get(situation, {}).get(backend)
        return [] if stats is None else list(stats.by_pod)

    def exclusions(self, situation: Situation | None, now: datetime) -> dict[Backend, str]:
        """Backends the failure policy excludes in ``situation``, with the reason."""
        out: dict[Backend, str] = {}
        for backend, stats in self.group(situation).items():
            if stats.failures:
                reason = self.failure_policy.exclusion(stats.failures, now)
                if reason is not None:
                    out[backend] = reason
        return out

    def eligible(
        self, situation: Situation | None, valid: Iterable[Backend]
    ) -> list[tuple[Backend, BackendStats]]:
        """Valid backends with enough correct samples, fastest first (ties: table
        order). ``valid`` must already leave out what :meth:`exclusions` excludes."""
        group = self.group(situation)
        order = {b: i for i, b in enumerate(Backend)}
        ranked = [
            (b, group[b])
            for b in valid
            if b in group
            and group[b].samples >= self.min_samples
            and len(group[b].pods) >= self.min_pods
        ]
        ranked.sort(key=lambda bs: (-(bs[1].median_tflops or 0.0), order[bs[0]]))
        return ranked

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
            pods=len(stats.pods),
            runner_up=None if runner is None else runner[0],
            runner_up_tflops=None if runner_tflops is None else round(runner_tflops, 3),
            margin=None
            if not runner_tflops
            else round((best_tflops - runner_tflops) / runner_tflops, 4),
        )

    def summary(self, now: datetime | None = None) -> list[dict[str, Any]]:
        now = now or datetime.now(UTC)
        out = []
        for situation in sorted(self._groups):
            excluded = self.exclusions(situation, now)
            for backend, stats in sorted(self._groups[situation].items()):
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
                        "pods": len(stats.pods),
                        "failures": len(stats.failures),
                        "excluded": excluded.get(backend),
                        "median_tflops": None if median is None else round(median, 3),
                    }
                )
        return out


def observations_of_report(
    report: MeasurementReport, at: datetime | None = None, report_id: str | None = None
) -> list[Observation]:
    """The observations a measurement report contributes (none without a GPU); each
    names its source (``report_id`` and the result's index), as the store's read does."""
    cap = report.device.capability
    if cap is None:
        return []
    m = report.model
    situation = Situation(
        device=report.device.name or "",
        capability=f"{cap[0]}.{cap[1]}",
        dims=dims_key(m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
        dtype=report.dtype.value,
        packages=packages_key(report.packages),
        engine=engine_key(report.engine),
    )
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
    return f"m:{report_id}:{index}"


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


EMPTY = EvidenceIndex()
"""No evidence: what the agent's local fallback and a preview without a store use."""
