"""Staged overrides: starting a rollout, its steps, and the guards that halt it.

Pure functions over the schema's values, shared by the service's write path, its
preview and its guards (``service/rollouts.py`` applies them to the store). Which pods
are in a stage is the evaluator's ``in_stage``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from mla_switchboard.core.cause_words import halt
from mla_switchboard.core.causes import PersonHalt, PodAt, SlowdownHalt
from mla_switchboard.core.evidence import PodSample
from mla_switchboard.core.schemas import (
    Override,
    OverrideSpec,
    Rollout,
    RolloutSpec,
    duration_seconds,
    rollout_id,
)

__all__ = [
    "EvidenceCount",
    "RolloutAction",
    "Slowdown",
    "StaticSources",
    "acted",
    "count_sources",
    "evidence_source",
    "next_step",
    "promotion_due",
    "start",
    "stored_payload",
]

MIN_SAMPLES = 3
MIN_PODS = 2
"""Distinct evidence sources (``evidence_source``) a slowdown needs on each side."""

VERIFIED = "pod:"
STATIC = "token:"
UNATTRIBUTED = "name:"


StaticSources = Literal["per_pod", "per_token"]
"""How a static token's reports count (``SWITCHBOARD_GUARD_STATIC_SOURCES``)."""


def evidence_source(
    principal: str | None,
    verified: bool,
    cluster: str,
    pod: str | None,
    static: StaticSources = "per_pod",
) -> str:
    """The unit a guard counts for a report on a decision asked for by ``principal``.

    A verified pod (its service-account token, ``workload:<uid>``) is one source per pod
    UID: ``pod:<uid>``. A static token proves only that the caller holds a secret its
    cluster's pods share, so its pod names are claims: ``per_pod`` (the default) counts
    each pod name the token recorded a decision for once, ``token:<id>/<cluster>/<pod>``
    (a crash-looping pod is one source, an invented name costs the inventor a recorded
    decision and shows in the rollout as static evidence); ``per_token`` counts the token
    once however many pods it names, ``token:<id>`` (forgery-proof, but pods sharing a
    token can then never reach a threshold above 1). A decision recorded before askers
    were kept (no principal) counts under its pod's name: ``name:<cluster>/<pod>``."""
    if principal is None:
        return f"{UNATTRIBUTED}{cluster}/{pod or '?'}"
    if verified:
        return VERIFIED + principal.removeprefix("workload:")
    if static == "per_token":
        return STATIC + principal
    return f"{STATIC}{principal}/{cluster}/{pod or '?'}"


@dataclass(frozen=True)
class EvidenceCount:
    """How many distinct sources a guard's figure rests on, and of what kind: the
    rollout view's ``evidence`` (``static_sources`` includes unattributed old rows)."""

    verified_pods: int = 0
    static_sources: int = 0

    @property
    def total(self) -> int:
        return self.verified_pods + self.static_sources

    def text(self) -> str:
        return f"{self.verified_pods} verified pod(s), {self.static_sources} static source(s)"


def count_sources(sources: Iterable[str]) -> EvidenceCount:
    """Distinct ``sources`` counted by kind."""
    distinct = set(sources)
    verified = sum(1 for s in distinct if s.startswith(VERIFIED))
    return EvidenceCount(verified, len(distinct) - verified)


def start(cluster: str, spec: RolloutSpec, override: OverrideSpec, now: datetime) -> Rollout:
    """The state of a rollout as a PUT writes it: a new stage starts now.

    Its id comes from what the override does (``rollout_id``), so a PUT that raises
    ``percent`` keeps every pod that was in; a PUT also resumes a halted rollout."""
    return Rollout(
        **spec.model_dump(),
        id=rollout_id(cluster, override),
        state="complete" if spec.percent >= 100 else "active",
        stage_started_at=now,
    )


def stored_payload(cluster: str, spec: OverrideSpec, now: datetime) -> dict[str, object]:
    """What is stored (and previewed) for ``PUT /v1/overrides/{cluster}``: the spec, with
    the rollout's state when it is staged."""
    payload = spec.model_dump(mode="json")
    if spec.rollout is not None:
        payload["rollout"] = start(cluster, spec.rollout, spec, now).model_dump(mode="json")
    return payload


RolloutAction = Literal["halt", "resume", "promote"]


def acted(
    r: Rollout, action: RolloutAction, *, by: str, note: str, now: datetime, to: int | None = None
) -> Rollout | str:
    """What an admin's halt, resume or promote makes of rollout ``r``, or why it cannot
    (a string, answered 409): halt an active rollout (its pods go back to what they
    ran without it); resume a halted one (a new stage starts: failures and the stage
    clock start again); promote an active one to ``to`` percent, by default its next
    step (a new stage; 100 completes it)."""
    if action == "halt":
        if r.state != "active":
            return f"the rollout is {r.state}: only an active rollout can be halted"
        cause = PersonHalt(by=by, note=note)
        update = {"state": "halted", "halted_reason": halt(cause), "halted_at": now}
        return r.model_copy(update={**update, "halted_cause": cause})
    if action == "resume":
        if r.state != "halted":
            return f"the rollout is {r.state}: only a halted rollout can be resumed"
        return r.model_copy(
            update={
                "state": "active",
                "stage_started_at": now,
                "failures": 0,
                "failed_pods": [],
                "failure_sources": [],
                "halted_reason": None,
                "halted_cause": None,
                "halted_at": None,
            }
        )
    if r.state != "active":
        return f"the rollout is {r.state}: resume it before promoting it"
    target = to if to is not None else next_step(r)
    if target is None:
        return "the rollout has no next step: give the percentage to promote to"
    if target <= r.percent:
        return f"promote raises the stage: {target} % is not above the current {r.percent} %"
    return r.model_copy(
        update={
            "percent": target,
            "stage_started_at": now,
            "failures": 0,
            "failed_pods": [],
            "failure_sources": [],
            "state": "complete" if target >= 100 else "active",
        }
    )


def next_step(r: Rollout) -> int | None:
    """The next percentage to promote to, or None at the last step."""
    return next((p for p in r.steps or () if p > r.percent), None)


def step_due_at(r: Rollout) -> datetime | None:
    """When the current stage's step comes due (None: no timed steps)."""
    if r.step_every is None or r.stage_started_at is None:
        return None
    return r.stage_started_at + timedelta(seconds=duration_seconds(r.step_every))


def promotion_due(r: Rollout, now: datetime) -> int | None:
    """The percentage to promote to now (a step_every passed with no guard fired)."""
    if r.state != "active" or r.step_every is None or r.stage_started_at is None:
        return None
    step = next_step(r)
    if step is None:
        return None
    if now - r.stage_started_at < timedelta(seconds=duration_seconds(r.step_every)):
        return None
    return step


@dataclass(frozen=True)
class Slowdown:
    """Stage pods measured the backend the override gave them slower than the one they
    would run without it, by more than the rollout allows."""

    staged: str
    staged_tflops: float
    staged_samples: int
    staged_pods: tuple[str, ...]
    without: str
    without_tflops: float
    without_samples: int
    percent_slower: float
    staged_sources: EvidenceCount = EvidenceCount()

    def cause(self, limit: float) -> SlowdownHalt:
        """The halt this slowdown causes under ``max_slowdown_pct`` ``limit``."""
        return SlowdownHalt(
            staged=self.staged,
            staged_tflops=self.staged_tflops,
            staged_samples=self.staged_samples,
            pods=[PodAt(cluster=c, pod=p) for c, _, p in map(_split, self.staged_pods)],
            without=self.without,
            without_tflops=self.without_tflops,
            without_samples=self.without_samples,
            percent_slower=self.percent_slower,
            max_slowdown_pct=limit,
            verified_pods=self.staged_sources.verified_pods,
            static_sources=self.staged_sources.static_sources,
        )

    def reason(self, limit: float) -> str:
        return halt(self.cause(limit))


def _split(where: str) -> tuple[str, str, str]:
    return where.partition("/")


def slowdown(
    override: Override,
    staged: str,
    without: str,
    stage_samples: Callable[[str], Sequence[PodSample]],
    source_of: Callable[[str, str], str] | None = None,
) -> Slowdown | None:
    """The guard on speed: compare the stage pods' own samples of the backend the
    override gives them with their samples of the one they would run without it
    (at least 3 samples from 2 pods each, in one situation). ``stage_samples(backend)``
    gives that backend's counted (cluster, pod, TFLOP/s) samples of the pods that may
    halt this stage, reported since it began (``EvidenceIndex.stage_samples``): what
    was measured before the last resume or step was already judged, and counting it
    again would halt a resumed rollout at the first report.

    ``source_of(cluster, pod)`` names the evidence source of a pod's samples
    (``evidence_source``); the pods of each side must be ``MIN_PODS`` distinct sources,
    so one static token naming many pods is one. Without it each pod is its own."""
    r = override.rollout
    if r is None or staged == without:
        return None
    source = source_of or (lambda c, p: f"{UNATTRIBUTED}{c}/{p}")

    def measured(backend: str) -> tuple[list[float], set[str], set[str]]:
        picked = stage_samples(backend)
        pods = {(c, p) for c, p, _ in picked}
        return (
            [t for _, _, t in picked],
            {f"{c}/{p}" for c, p in pods},
            {source(c, p) for c, p in pods},
        )

    on, on_pods, on_sources = measured(staged)
    if len(on) < MIN_SAMPLES or len(on_sources) < MIN_PODS:
        return None
    off, _, off_sources = measured(without)
    if len(off) < MIN_SAMPLES or len(off_sources) < MIN_PODS:
        return None
    on_median, off_median = statistics.median(on), statistics.median(off)
    if off_median <= 0:
        return None
    slower = 100.0 * (1.0 - on_median / off_median)
    if slower <= r.max_slowdown_pct:
        return None
    return Slowdown(
        staged,
        on_median,
        len(on),
        tuple(sorted(on_pods)),
        without,
        off_median,
        len(off),
        slower,
        count_sources(on_sources),
    )
