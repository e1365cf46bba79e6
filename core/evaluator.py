"""The decision: which MLA prefill backend a pod should run, and why.

Pure and deterministic: a function of the request, the rules, the overrides in force
and (for measured selection) the evidence, with no I/O. The service runs it on every
``/v1/select`` and the agent runs the very same code when the service cannot be
reached, which is what keeps the two from drifting apart.

Precedence, highest first (issue 3): an override's ``deny`` removes backends; an
override's ``force`` wins when valid; the pod's ``requested_backend`` wins when valid;
then measured evidence (policy ``measured``), then the priority list, then the
fallback chain FLASH_ATTN -> TORCH_SDPA.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from mla_switchboard.core.schemas import (
    FLEET,
    SEED_RULES,
    Candidate,
    CandidateRole,
    Evidence,
    Override,
    OverrideRef,
    Policy,
    RulesDocument,
    RuleSet,
    SelectRequest,
    SelectResponse,
    Source,
)
from mla_switchboard.core.specs import SPECS, Backend, Capability, MLADims, SelectionContext

FALLBACK_CHAIN: tuple[Backend, ...] = (Backend.FLASH_ATTN, Backend.TORCH_SDPA)

EvidenceRanker = Callable[[SelectRequest, dict[Backend, list[str]]], Evidence | None]
"""Given the request and every backend's invalid reasons, the measured winner (or None
when the evidence is too thin). Supplied by the service's measurement store."""


@dataclass(frozen=True)
class Decision:
    backend: Backend
    source: Source
    candidates: tuple[Candidate, ...]
    messages: tuple[str, ...]
    overrides: tuple[OverrideRef, ...] = ()
    evidence: Evidence | None = None

    def to_response(self, *, rules_revision: int, decision_id: str | None) -> SelectResponse:
        return SelectResponse(
            backend=self.backend,
            source=self.source,
            candidates=list(self.candidates),
            messages=list(self.messages),
            rules_revision=rules_revision,
            decision_id=decision_id,
            overrides=list(self.overrides),
            evidence=self.evidence,
        )


@dataclass(frozen=True)
class Refusal:
    """No backend can be given: a strict request that is invalid, or nothing valid at all.

    Returned as a value (the HTTP edge turns it into 409) so that callers such as the
    agent and the preview can inspect the reasons.
    """

    kind: str  # "requested_invalid" | "no_valid_backend"
    message: str
    candidates: tuple[Candidate, ...]
    overrides: tuple[OverrideRef, ...] = ()


@dataclass
class _Trace:
    order: list[tuple[Backend, CandidateRole]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    def consider(self, backend: Backend, role: CandidateRole) -> None:
        if all(b is not backend for b, _ in self.order):
            self.order.append((backend, role))


def context_of(request: SelectRequest) -> SelectionContext:
    cap = request.device.capability
    return SelectionContext(
        capability=None if cap is None else Capability(*cap),
        dims=MLADims(
            request.model.qk_nope_head_dim,
            request.model.qk_rope_head_dim,
            request.model.v_head_dim,
        ),
        dtype=request.dtype,
        packages=request.packages,
    )


def applicable_overrides(
    request: SelectRequest, overrides: Sequence[Override], now: datetime
) -> list[Override]:
    """Overrides in force for this request: fleet first, then the cluster's own."""
    matched = [
        o
        for o in overrides
        if o.cluster in (FLEET, request.cluster)
        and (o.expires_at is None or o.expires_at > now)
        and (o.model is None or fnmatch.fnmatchcase(request.model.name or "", o.model))
    ]
    matched.sort(key=lambda o: o.cluster != FLEET)
    return matched


def priority_list(rules: RulesDocument, cluster: str, cap: Capability) -> tuple[list[Backend], str]:
    """The priority list for a cluster and capability, and a label saying which rule."""
    scopes: list[tuple[RuleSet, str]] = []
    if cluster in rules.clusters:
        scopes.append((rules.clusters[cluster], f"cluster {cluster} rule"))
    scopes.append((rules, "fleet rule"))
    for ruleset, scope in scopes:
        for key in (f"{cap.major}.{cap.minor}", str(cap.major)):
            if key in ruleset.by_capability:
                return ruleset.by_capability[key], f"{scope} for capability {key}"
        if ruleset.default is not None:
            return ruleset.default, f"{scope} default"
    return [], "no rule"  # unreachable: the fleet default is a list


def invalid_reasons(request: SelectRequest, active: Sequence[Override]) -> dict[Backend, list[str]]:
    """Why each backend cannot serve this request: its spec, then the active denies."""
    ctx = context_of(request)
    reasons: dict[Backend, list[str]] = {b: SPECS[b].validate(ctx) for b in Backend}
    for o in active:
        for backend in o.deny:
            reasons[backend].append(f"denied by {o.label}: {o.note}")
    return reasons


def _effects(o: Override) -> list[str]:
    effects = [f"deny {b}" for b in o.deny]
    if o.force is not None:
        effects.append(f"force {o.force}")
    if o.policy is not None:
        effects.append(f"policy {o.policy}")
    return effects


def effective_policy(overrides: Sequence[Override]) -> Policy:
    policy: Policy = "priority"
    for o in overrides:  # fleet first, the cluster's own last: the more specific wins
        if o.policy is not None:
            policy = o.policy
    return policy


def decide(
    request: SelectRequest,
    rules: RulesDocument,
    overrides: Sequence[Override] = (),
    *,
    now: datetime,
    rank_by_evidence: EvidenceRanker | None = None,
) -> Decision | Refusal:
    """Choose a backend for ``request``; see the module docstring for precedence."""
    cap = request.device.capability
    active = applicable_overrides(request, overrides, now)
    reasons = invalid_reasons(request, active)
    refs = [
        OverrideRef(cluster=o.cluster, effect=", ".join(_effects(o)), note=o.note) for o in active
    ]

    trace = _Trace()

    def finish(backend: Backend, source: Source, evidence: Evidence | None = None) -> Decision:
        return Decision(
            backend=backend,
            source=source,
            candidates=_candidates(trace, reasons),
            messages=tuple(trace.messages),
            overrides=tuple(refs),
            evidence=evidence,
        )

    forcing = [o for o in active if o.force is not None]
    if forcing:
        force_by = forcing[-1]  # the cluster's own force beats the fleet's
        forced = force_by.force
        assert forced is not None
        trace.consider(forced, "forced")
        if not reasons[forced]:
            trace.messages.append(f"Forced to {forced} by {force_by.label}: {force_by.note}")
            if request.requested_backend not in (None, forced):
                trace.messages.append(
                    f"Requested MLA prefill backend {request.requested_backend} "
                    f"was overridden by {force_by.label}."
                )
            return finish(forced, "override")
        trace.messages.append(
            f"Backend {forced} forced by {force_by.label} is not valid: "
            f"{reasons[forced]}. Skipping the override."
        )

    requested = request.requested_backend
    if requested is not None:
        trace.consider(requested, "requested")
        if not reasons[requested]:
            trace.messages.append(f"Using requested MLA prefill backend {requested}.")
            return finish(requested, "requested")
        if request.strict:
            return Refusal(
                kind="requested_invalid",
                message=(
                    f"Requested MLA prefill backend {requested} is not valid: "
                    f"{reasons[requested]}. strict is true, so no other backend is chosen."
                ),
                candidates=_candidates(trace, reasons),
                overrides=tuple(refs),
            )
        trace.messages.append(
            f"Requested MLA prefill backend {requested} is not valid: "
            f"{reasons[requested]}. Falling back to auto-selection."
        )

    if cap is None:
        trace.messages.append("No CUDA device: using the CPU-capable fallback.")
    else:
        if rank_by_evidence is not None and effective_policy(active) == "measured":
            evidence = rank_by_evidence(request, reasons)
            if evidence is not None and not reasons[evidence.backend]:
                trace.consider(evidence.backend, "measured")
                trace.messages.append(
                    f"Using {evidence.backend}: fastest correct backend measured for this "
                    f"device, dims and dtype ({evidence.median_tflops:.0f} TFLOP/s median over "
                    f"{evidence.samples} samples from {evidence.pods} pods)."
                )
                return finish(evidence.backend, "measured", evidence)
            trace.messages.append(
                "Policy is measured but the evidence for this situation is too thin; "
                "using the priority list."
            )
        listed, rule = priority_list(rules, request.cluster, Capability(*cap))
        for backend in listed:
            trace.consider(backend, "priority")
        for backend in listed:
            if not reasons[backend]:
                trace.messages.append(
                    f"Using {backend}: first valid backend in the priority list ({rule}: "
                    f"{', '.join(b.value for b in listed)})."
                )
                return finish(backend, "priority")
        trace.messages.append(
            f"No backend in the priority list ({rule}: "
            f"{', '.join(b.value for b in listed) or 'empty'}) is valid."
        )

    for backend in FALLBACK_CHAIN:
        trace.consider(backend, "fallback")
    for backend in FALLBACK_CHAIN:
        if not reasons[backend]:
            trace.messages.append(f"Using fallback {backend}.")
            return finish(backend, "fallback")
    return Refusal(
        kind="no_valid_backend",
        message="No MLA prefill backend is valid for this pod, not even TORCH_SDPA.",
        candidates=_candidates(trace, reasons),
        overrides=tuple(refs),
    )


def _candidates(trace: _Trace, reasons: dict[Backend, list[str]]) -> tuple[Candidate, ...]:
    """Every backend, in the order the decision considered them, then the fallback chain
    (what a pod tries if its chosen kernel fails to build), then the rest."""
    for backend in FALLBACK_CHAIN:
        trace.consider(backend, "fallback")
    for backend in Backend:
        trace.consider(backend, "unlisted")
    return tuple(
        Candidate(backend=b, valid=not reasons[b], reasons=list(reasons[b]), role=role)
        for b, role in trace.order
    )


def decide_locally(request: SelectRequest) -> Decision | Refusal:
    """The agent's fail-static answer: the seed rules, no overrides, no evidence."""
    return decide(request, SEED_RULES, (), now=datetime.now(UTC))
