"""Measured selection: the fleet's own benchmarks, aggregated per exact situation.

A *situation* is what decides which kernel is fastest: device name, compute
capability, MLA dims, dtype and the versions of the kernel packages. Evidence for a
backend counts only when it comes from that same situation; a backend that was ever
wrong (failed its correctness check) or failed to build on a matching pod is never
chosen by evidence. The index is rebuilt from the store when measurements arrive (on
any replica: ``meta.evidence_version``) and read from memory on the hot path.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mla_switchboard.core.schemas import Evidence, MeasurementReport, SelectRequest
from mla_switchboard.core.specs import Backend

KERNEL_PACKAGES = ("torch", "flash_attn", "flashinfer", "cudnn")
"""Only these packages' versions change kernel speed; others don't split the evidence."""


@dataclass(frozen=True, order=True)
class Situation:
    device: str
    capability: str
    dims: str
    dtype: str
    packages: str  # canonical JSON of the kernel packages' versions


def packages_key(packages: Mapping[str, str]) -> str:
    return json.dumps(
        {k: packages[k] for k in KERNEL_PACKAGES if k in packages},
        sort_keys=True,
        separators=(",", ":"),
    )


def dims_key(qk_nope: int, qk_rope: int, v: int) -> str:
    return f"{qk_nope},{qk_rope},{v}"


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
    )


@dataclass
class BackendStats:
    tflops: list[float] = field(default_factory=list)
    pods: set[str] = field(default_factory=set)
    failures: int = 0

    @property
    def samples(self) -> int:
        return len(self.tflops)

    @property
    def median_tflops(self) -> float | None:
        return statistics.median(self.tflops) if self.tflops else None


@dataclass(frozen=True)
class Observation:
    """One measured result or one reported failure, already keyed by situation."""

    situation: Situation
    backend: str
    pod: str
    tflops: float | None
    ok: bool


class EvidenceIndex:
    def __init__(
        self, observations: Iterable[Observation], *, min_samples: int, min_pods: int
    ) -> None:
        self.min_samples = min_samples
        self.min_pods = min_pods
        self.groups: dict[Situation, dict[Backend, BackendStats]] = defaultdict(dict)
        self.add(observations)

    def add(self, observations: Iterable[Observation]) -> None:
        """Fold new observations in. A report updates the index in place (cheap);
        the periodic full rebuild from the store keeps replicas in step and drops
        evidence that aged out."""
        for o in observations:
            try:
                backend = Backend(o.backend)
            except ValueError:
                continue
            stats = self.groups[o.situation].setdefault(backend, BackendStats())
            if o.ok and o.tflops is not None:
                stats.tflops.append(o.tflops)
                stats.pods.add(o.pod)
            elif not o.ok:
                stats.failures += 1

    def eligible(
        self, situation: Situation, valid: Iterable[Backend]
    ) -> list[tuple[Backend, BackendStats]]:
        """Valid backends with enough clean evidence, fastest first (ties: table order)."""
        group = self.groups.get(situation, {})
        order = {b: i for i, b in enumerate(Backend)}
        ranked = [
            (b, group[b])
            for b in valid
            if b in group
            and group[b].failures == 0
            and group[b].samples >= self.min_samples
            and len(group[b].pods) >= self.min_pods
        ]
        ranked.sort(key=lambda bs: (-(bs[1].median_tflops or 0.0), order[bs[0]]))
        return ranked

    def rank(self, request: SelectRequest, reasons: Mapping[Backend, list[str]]) -> Evidence | None:
        situation = situation_of(request)
        if situation is None:
            return None
        ranked = self.eligible(situation, [b for b in Backend if not reasons[b]])
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

    def summary(self) -> list[dict[str, Any]]:
        out = []
        for situation in sorted(self.groups):
            for backend, stats in sorted(self.groups[situation].items()):
                median = stats.median_tflops
                out.append(
                    {
                        "device": situation.device,
                        "capability": situation.capability,
                        "dims": [int(x) for x in situation.dims.split(",")],
                        "dtype": situation.dtype,
                        "backend": backend.value,
                        "packages": json.loads(situation.packages),
                        "samples": stats.samples,
                        "pods": len(stats.pods),
                        "failures": stats.failures,
                        "median_tflops": None if median is None else round(median, 3),
                    }
                )
        return out


def observations_of_report(report: MeasurementReport) -> list[Observation]:
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
    )
    return [
        Observation(
            situation=situation,
            backend=r.backend.value,
            pod=report.pod,
            tflops=r.tflops,
            ok=r.correct and r.error is None,
        )
        for r in report.results
    ]
