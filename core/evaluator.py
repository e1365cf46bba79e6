"""The decision: which MLA prefill backend a pod should run, and why.

Pure and deterministic: a function of the request, the rules, the overrides in force
and (for measured selection) the evidence, with no I/O. The service runs it on every
``/v1/select`` and the agent runs the very same code when the service cannot be
reached, which is what keeps the two from drifting apart.

A backend is valid only when our spec (``specs.py``: the kernel can run here), the
pod's serving engine (``engines.py``: the engine accepts it) and the overrides all
accept it; under policy ``measured`` failure evidence can exclude it too. Every
exclusion is a reason in the answer.

Precedence, highest first: an override's ``deny`` removes backends; an override's
``force`` wins when valid; the pod's ``requested_backend`` wins when valid and the
engine can be told it (a release without a flag for it, or an engine of unknown
version without one every release takes, decides for itself: strict is refused); then
measured evidence (policy ``measured``), then the priority list (the rules, or the
engine's own order under policy ``engine-default``), then the fallback chain
FLASH_ATTN -> TORCH_SDPA, then any other valid backend. Nothing valid: a refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Literal

from mla_switchboard.core import cause_words
from mla_switchboard.core.causes import ExclusionWaived, FailureNotice, MeasuredExclusion
from mla_switchboard.core.engines import (
    ENGINES,
    OWN_ENGINE,
    EngineChoice,
    EngineProfile,
    choose,
    resolve,
)
from mla_switchboard.core.evidence import EMPTY, EvidenceIndex, Situation, situation_of
from mla_switchboard.core.exclusions import measured_failures
from mla_switchboard.core.names import model_matches
from mla_switchboard.core.schemas import (
    FLEET,
    SEED_RULES,
    Candidate,
    CandidateRole,
    EngineInfo,
    Evidence,
    Override,
    OverrideRef,
    Policy,
    RolloutRef,
    RulesDocument,
    RuleSet,
    SelectRequest,
    SelectResponse,
    Source,
)
from mla_switchboard.core.specs import Backend, Capability, MLADims, SelectionContext
from mla_switchboard.core.stages import bucket_in_stage, stage_bucket

__all__ = [
    "FALLBACK_CHAIN",
    "Assessment",
    "Decision",
    "DecisionInputs",
    "OverrideSet",
    "Refusal",
    "applicable_overrides",
    "assess",
    "context_of",
    "decide",
    "decide_locally",
    "decision_key",
    "effective_policy",
    "in_stage",
    "priority_list",
    "request_traits",
]

FALLBACK_CHAIN: tuple[Backend, ...] = (Backend.FLASH_ATTN, Backend.TORCH_SDPA)
_BACKENDS: tuple[Backend, ...] = tuple(Backend)
"""Every backend in the table's order (iterating the enum itself costs microseconds a
time, and a fleet read decides thousands of groups)."""
DEFAULT_ENGINE = EngineInfo()


class OverrideSet(tuple[Override, ...]):
    """The overrides in force: the tuple they are (equal to it, in its order), with
    each cluster's share found once.

    A request of cluster ``c`` can only be touched by the fleet's overrides (``*``)
    and ``c``'s own, so everything that asks which overrides apply to a request
    (``applicable_overrides``, ``decision_key``, a fleet read's stage classes) reads
    :meth:`for_cluster` instead of scanning them all: with an override on each of a
    thousand clusters that is the difference between two overrides and a thousand per
    request. Being the tuple itself, it travels with ``DecisionInputs`` through
    ``dataclasses.replace`` (a decision's evidence is narrowed that way), so the index
    is built once per set of overrides, not once per decision."""

    _joined: dict[str, tuple[Override, ...]]
    _staged: dict[str, tuple[Override, ...]]

    def __new__(cls, overrides: Iterable[Override] = ()) -> OverrideSet:
        self = super().__new__(cls, overrides)
        self._joined = {}  # per cluster asked: the fleet's and its own, joined once
        self._staged = {}  # per cluster asked: the partial rollouts among those
        return self

    @cached_property
    def _by_cluster(self) -> dict[str, tuple[Override, ...]]:
        found: dict[str, list[Override]] = {}
        for o in self:
            found.setdefault(o.cluster, []).append(o)
        return {cluster: tuple(mine) for cluster, mine in found.items()}

    @cached_property
    def _positions(self) -> dict[int, int]:
        return {id(o): i for i, o in enumerate(self)}

    def position(self, o: Override) -> int:
        """Where ``o`` (one of the set's own objects) is in the set."""
        return self._positions[id(o)]

    def own(self, cluster: str) -> tuple[Override, ...]:
        """The overrides whose scope is exactly ``cluster`` (``*``: the fleet's)."""
        return self._by_cluster.get(cluster, ())

    def for_cluster(self, cluster: str) -> tuple[Override, ...]:
        """Every override that may apply to a pod of ``cluster``: the fleet's, then the
        cluster's own, each in the set's order (what ``applicable_overrides`` would
        keep of the whole set before looking at the model and the expiry)."""
        joined = self._joined
        found = joined.get(cluster)
        if found is None:
            fleet = self.own(FLEET)
            found = fleet if cluster == FLEET else fleet + self.own(cluster)
            joined[cluster] = found  # a race stores the same value twice
        return found

    def staged_for(self, cluster: str) -> tuple[Override, ...]:
        """The partial rollouts (active, under 100 %) among :meth:`for_cluster`."""
        staged = self._staged
        found = staged.get(cluster)
        if found is None:
            found = staged[cluster] = tuple(o for o in self.for_cluster(cluster) if _partial(o))
        return found

    @classmethod
    def of(cls, overrides: Sequence[Override]) -> OverrideSet:
        """``overrides`` as a set with its index (itself when it is one already)."""
        return overrides if isinstance(overrides, OverrideSet) else cls(overrides)


@dataclass(frozen=True)
class DecisionInputs:
    """Everything besides the request that a decision depends on, in one immutable value.

    The service builds a new one whenever the rules, the overrides or the evidence
    change and swaps it in with one assignment; requests read whichever is current and
    never see a half-applied change. ``tag`` identifies it for the decision cache.
    ``overrides`` is kept as an :class:`OverrideSet` (any sequence given is turned
    into one), so what applies to one cluster is found without reading the others.
    """

    rules: RulesDocument
    overrides: tuple[Override, ...] = ()
    evidence: EvidenceIndex = EMPTY
    tag: tuple[int, int] = (0, 0)  # (config version, evidence version: every change)
    evidence_generation: int = 0
    """Moves only when the evidence indexes themselves are replaced or restructured (a
    full reload, a new trust scope or cluster index, an expiry). Between two such
    moves evidence changes one situation at a time, so a decision that names the
    situation it read (``Decision.evidence_situation``) can be kept until that
    situation's evidence changes, and every other decision across all of them."""

    def __post_init__(self) -> None:
        if not isinstance(self.overrides, OverrideSet):
            object.__setattr__(self, "overrides", OverrideSet(self.overrides))

    @property
    def override_set(self) -> OverrideSet:
        """``overrides`` with its index by cluster (see :class:`OverrideSet`)."""
        return OverrideSet.of(self.overrides)

    def overrides_for(self, cluster: str) -> tuple[Override, ...]:
        """The overrides that may apply to a pod of ``cluster``: the fleet's and the
        cluster's own (``OverrideSet.for_cluster``), found once per inputs."""
        return self.override_set.for_cluster(cluster)

    def staged_for(self, cluster: str) -> tuple[Override, ...]:
        """The partial rollouts a pod of ``cluster`` may be in the stage of: the fleet's
        and the cluster's own (what ``decision_key`` reads), found once per inputs, so
        the hot path's cost does not grow with the overrides of other clusters."""
        return self.override_set.staged_for(cluster)


LOCAL_INPUTS = DecisionInputs(rules=SEED_RULES)
"""The agent's fail-static inputs: the seed rules, no overrides, no evidence."""


def decision_key(
    request: SelectRequest, overrides: Sequence[Override] = (), bucket: int | None = None
) -> tuple[Any, ...]:
    """Everything in ``request`` that the evaluator reads, as a hashable key.

    ``node`` and ``pod`` are left out: they name the pod, they do not describe it. The
    one thing a pod's name does decide, whether it is in the stage of a staged
    override, is in the key as one bit per such override of the fleet or the pod's
    cluster (``overrides``: those in the inputs, or ``DecisionInputs.staged_for`` its
    cluster; ``bucket``: the pod's stage bucket when the caller knows it, else it is
    computed from the request). ``tests/core`` changes every other field of a request
    one at a time and fails if the key does not change, so a field added to the schema
    cannot be forgotten here.
    """
    m = request.model
    d = request.device
    e = request.engine
    if isinstance(overrides, OverrideSet):  # the same bits, in the same order, as a scan
        overrides = sorted(overrides.staged_for(request.cluster), key=overrides.position)
    partial = [o for o in overrides if _partial(o) and o.cluster in (FLEET, request.cluster)]
    if partial and bucket is None:
        bucket = stage_bucket(request.cluster, request.pod)
    return (
        request.cluster,
        d.name,
        d.capability,
        m.name,
        m.qk_nope_head_dim,
        m.qk_rope_head_dim,
        m.v_head_dim,
        m.num_heads,
        request.dtype,
        None if request.packages is None else tuple(sorted(request.packages.items())),
        request.requested_backend,
        request.strict,
        None if e is None else (e.name, e.version),
        tuple(bucket_in_stage(bucket, o.rollout) for o in partial if o.rollout is not None),
    )


def _partial(o: Override) -> bool:
    r = o.rollout
    return r is not None and r.state == "active" and r.percent < 100


def in_stage(request: SelectRequest, o: Override, bucket: int | None = None) -> bool:
    """Whether a staged override applies to this pod (``core/stages.py``: a stable
    bucket per pod, a range of buckets per rollout). ``bucket``: the pod's, when the
    caller has it (a replay of stored pods); else computed from the request."""
    r = o.rollout
    if r is None:
        return True
    if bucket is None:
        bucket = stage_bucket(request.cluster, request.pod)
    return bucket_in_stage(bucket, r)


@dataclass(frozen=True)
class Decision:
    backend: Backend
    source: Source
    candidates: tuple[Candidate, ...]
    messages: tuple[str, ...]
    overrides: tuple[OverrideRef, ...] = ()
    evidence: Evidence | None = None
    engine: EngineInfo = field(default_factory=EngineInfo)
    engine_args: tuple[str, ...] = ()
    engine_env: tuple[tuple[str, str], ...] = ()
    why: str = ""  # the one message that says why this backend (also in ``messages``)
    evidence_situation: Situation | None = None
    """The situation whose evidence this decision read (policy ``measured``: its
    exclusions and ranking); None when evidence played no part, so new evidence
    cannot change it."""

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
            engine=self.engine,
            engine_args=list(self.engine_args),
            engine_env=dict(self.engine_env),
        )


@dataclass(frozen=True)
class Refusal:
    """No backend can be given: a strict request that is invalid, or nothing valid at all.

    Returned as a value (the HTTP edge turns it into 409) so that callers such as the
    agent and the preview can inspect the reasons. Every candidate of a
    ``no_valid_backend`` refusal is invalid and says why.
    """

    kind: str  # "requested_invalid" | "no_valid_backend"
    message: str
    candidates: tuple[Candidate, ...]
    overrides: tuple[OverrideRef, ...] = ()
    engine: EngineInfo = field(default_factory=EngineInfo)
    evidence_situation: Situation | None = None  # as Decision.evidence_situation


@dataclass
class _Trace:
    order: list[tuple[Backend, CandidateRole]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    considered: set[Backend] = field(default_factory=set)

    def consider(self, backend: Backend, role: CandidateRole) -> None:
        if backend not in self.considered:
            self.considered.add(backend)
            self.order.append((backend, role))

    def say(self, message: str) -> str:
        """Add ``message`` to the explanation; it is also the decision's ``why``."""
        self.messages.append(message)
        return message


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
    """Overrides in force for this request: fleet first, then the cluster's own.
    Given an :class:`OverrideSet` (``DecisionInputs.overrides``), only the fleet's and
    the request's cluster's are read."""
    candidates = (
        overrides.for_cluster(request.cluster) if isinstance(overrides, OverrideSet) else overrides
    )
    matched = [
        o
        for o in candidates
        if o.cluster in (FLEET, request.cluster)
        and (o.expires_at is None or o.expires_at > now)
        and model_matches(request.model.name, o.model)
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
        for key in (str(cap), str(cap.major)):
            if key in ruleset.by_capability:
                return ruleset.by_capability[key], f"{scope} for capability {key}"
        if ruleset.default is not None:
            return ruleset.default, f"{scope} default"
    return [], "no rule"  # unreachable: the fleet default is a list


def effective_policy(overrides: Sequence[Override]) -> Policy:
    policy: Policy = "priority"
    for o in overrides:  # fleet first, the cluster's own last: the more specific wins
        if o.policy is not None:
            policy = o.policy
    return policy


@dataclass(frozen=True)
class Assessment:
    """What is known about a request before any choice: the overrides in force, the
    policy, the engine, and every backend's reasons against it (our spec, the engine's
    rule, the overrides' denies and, under policy ``measured``, failure evidence)."""

    active: tuple[Override, ...]
    staged: tuple[tuple[Override, bool], ...]  # every staged override in force, in stage?
    policy: Policy
    engine: EngineInfo
    profile: EngineProfile
    situation: Situation | None
    reasons: dict[Backend, list[str]]
    # the measured-policy exclusions among ``reasons``, as data (their reason is
    # ``cause_words.exclusion`` of it)
    exclusions: dict[Backend, MeasuredExclusion] = field(default_factory=dict)
    # what reported failures did to backends that stay valid (below the policy's pods,
    # or kept as the last one left), each said in the answer
    notices: dict[Backend, FailureNotice] = field(default_factory=dict)

    def valid(self) -> list[Backend]:
        return [b for b in _BACKENDS if not self.reasons[b]]


class Unknown:
    """The type of :data:`UNKNOWN`."""


UNKNOWN = Unknown()
"""A request's situation not known to the caller: ``assess`` works it out."""


def assess(
    request: SelectRequest,
    inputs: DecisionInputs,
    now: datetime,
    bucket: int | None = None,
    situation: Situation | Unknown | None = UNKNOWN,
) -> Assessment:
    """Every backend's reasons for ``request`` under ``inputs``: the one place validity is
    decided (the decision, the preview and the regret all read it from here).
    ``bucket``: the pod's stage bucket when the caller has it (see ``in_stage``);
    ``situation``: ``situation_of(request)`` when the caller has it (a fleet read
    decides many requests of one shape, whose situation it works out once)."""
    matched = applicable_overrides(request, inputs.override_set, now)
    if bucket is None and any(o.rollout is not None for o in matched):
        bucket = stage_bucket(request.cluster, request.pod)
    staged = tuple((o, in_stage(request, o, bucket)) for o in matched if o.rollout is not None)
    inside = {id(o) for o, yes in staged if yes}
    active = [o for o in matched if o.rollout is None or id(o) in inside]
    policy = effective_policy(active)
    engine = request.engine or DEFAULT_ENGINE
    profile = resolve(engine.name, engine.version)
    reasons = {b: list(why) for b, why in _own_reasons(request, engine, profile).items()}
    for o in active:
        for backend in o.deny:
            reasons[backend].append(f"denied by {o.label}: {o.note}")
    if isinstance(situation, Unknown):
        situation = situation_of(request)
    exclusions: dict[Backend, MeasuredExclusion] = {}
    notices: dict[Backend, FailureNotice] = {}
    if policy == "measured":
        exclusions, below = measured_failures(inputs.evidence, situation, now)
        notices.update(below)
        for backend, cause in exclusions.items():
            reasons[backend].append(cause_words.exclusion(cause))
        kept = _kept_valid(reasons, exclusions)
        if kept is not None:
            cause = exclusions.pop(kept)
            reasons[kept].remove(cause_words.exclusion(cause))
            notices[kept] = ExclusionWaived(
                backend=kept.value, pods=cause.pods, window_h=cause.window_h
            )
    return Assessment(
        tuple(active), staged, policy, engine, profile, situation, reasons, exclusions, notices
    )


def _kept_valid(
    reasons: dict[Backend, list[str]], exclusions: dict[Backend, MeasuredExclusion]
) -> Backend | None:
    """When failures exclude every backend that would otherwise be valid, the one with
    the fewest failing pods (then the first in the registry's order): a pod is never
    left with no backend by failures alone, which would turn a few pods' failures into
    an outage of every pod of the situation. None when one is valid without it."""
    if any(not why for why in reasons.values()):
        return None
    only_failures = [
        b
        for b in _BACKENDS
        if b in exclusions and reasons[b] == [cause_words.exclusion(exclusions[b])]
    ]
    if not only_failures:
        return None
    return min(only_failures, key=lambda b: exclusions[b].pods)


OWN_REASONS_KEPT = 4096
"""How many request descriptions' own reasons ``_own_reasons`` keeps (a fleet has a
few hundred: its deployments' GPUs, models, packages and engines)."""
_own_reasons_kept: dict[tuple[Any, ...], dict[Backend, tuple[str, ...]]] = {}


def request_traits(request: SelectRequest) -> tuple[Any, ...]:
    """What our spec reads of a request: the device's capability, the model's
    dimensions, the dtype and the packages (not its names, cluster or pod)."""
    m = request.model
    return (
        request.device.capability,
        m.qk_nope_head_dim,
        m.qk_rope_head_dim,
        m.v_head_dim,
        request.dtype,
        None if request.packages is None else tuple(sorted(request.packages.items())),
    )


def _own_reasons(
    request: SelectRequest, engine: EngineInfo, profile: EngineProfile
) -> dict[Backend, tuple[str, ...]]:
    """Every backend's reasons from our spec and the engine's rules alone: a function of
    what the request says of the device, model dims, dtype, packages and engine (not of
    its cluster, pod, overrides or evidence), so a fleet read deciding thousands of
    groups of a few hundred descriptions works each description's out once. Kept in a
    bounded table (emptied when full); a race computes the same value twice."""
    key = (*request_traits(request), engine.name, engine.version)
    found = _own_reasons_kept.get(key)
    if found is None:
        ctx = context_of(request)
        found = {b: tuple(profile.refusals(b, ctx, engine.version)) for b in _BACKENDS}
        if len(_own_reasons_kept) >= OWN_REASONS_KEPT:
            _own_reasons_kept.clear()
        _own_reasons_kept[key] = found
    return found


class _Described:
    """What a decision reads of a request's description alone (``request_traits`` and
    its engine): the selection context, the profile's notes, and how the engine is
    told each backend (``engines.choose``). Each is a function of that description, so
    a fleet read deciding thousands of groups of a few hundred descriptions works each
    out once (``_described``). Read, never changed."""

    __slots__ = ("_choices", "ctx", "engine", "notes", "profile", "profiles")

    def __init__(self, ctx: SelectionContext, engine: EngineInfo, profile: EngineProfile) -> None:
        self.ctx, self.engine, self.profile = ctx, engine, profile
        # the engine's registry entry as read: ``choose`` compares its releases
        self.profiles = ENGINES.get(profile.name)
        self.notes: tuple[str, ...] = tuple(profile.notes(engine.version))
        self._choices: dict[Backend, EngineChoice] = {}

    def choice(self, backend: Backend) -> EngineChoice:
        """``engines.choose`` of ``backend`` for this description (a race works one
        out twice, alike)."""
        found = self._choices.get(backend)
        if found is None:
            found = self._choices[backend] = choose(
                self.profile, self.engine.version, backend, self.ctx
            )
        return found


DESCRIBED_KEPT = 4096
"""How many descriptions ``_described`` keeps (as ``OWN_REASONS_KEPT``)."""
_described_kept: dict[tuple[Any, ...], _Described] = {}


def _described(request: SelectRequest, engine: EngineInfo, profile: EngineProfile) -> _Described:
    """The :class:`_Described` of ``request`` under ``engine`` (whose ``profile`` is
    ``resolve`` of its name and version), kept in a bounded table (emptied when full)."""
    key = (*request_traits(request), engine.name, engine.version)
    found = _described_kept.get(key)
    if (
        found is None
        or found.profile is not profile
        or found.profiles is not ENGINES.get(profile.name)
    ):
        found = _Described(context_of(request), engine, profile)
        if len(_described_kept) >= DESCRIBED_KEPT:
            _described_kept.clear()
        _described_kept[key] = found
    return found


def _refs(a: Assessment) -> tuple[OverrideRef, ...]:
    """The overrides that touched the decision: those applied, then staged ones this
    pod is outside of (their effect "none"), each with its stage."""
    stage = {id(o): inside for o, inside in a.staged}
    outside = [o for o, inside in a.staged if not inside]
    refs = []
    for o in [*a.active, *outside]:
        applied = any(o is x for x in a.active)
        refs.append(_override_ref(o, applied, stage[id(o)] if o.rollout is not None else None))
    return tuple(refs)


REFS_KEPT = 8192
"""How many distinct override references ``_override_ref`` keeps (a fleet read makes
a few per override: applied or not, in its stage or not)."""
_refs_kept: dict[tuple[Any, ...], OverrideRef] = {}


def _override_ref(o: Override, applied: bool, inside: bool | None) -> OverrideRef:
    """The reference a decision holds to ``o`` (``inside``: whether the pod is in its
    stage; None when it has none), made once per distinct content and shared by every
    decision that has it, as candidates are (``_candidate``): a fleet read makes
    thousands of decisions naming the same few overrides, and building the model is a
    tenth of a decision's cost. A decision's references are read, never changed."""
    r = o.rollout
    stage = None if r is None else (r.id, r.percent, r.state, inside)
    effect = ", ".join(_effects(o)) if applied else "none"
    key = (o.cluster, effect, o.note, o.revision, stage)
    found = _refs_kept.get(key)
    if found is None:
        rollout = None
        if r is not None:
            assert inside is not None
            rollout = RolloutRef(id=r.id, percent=r.percent, state=r.state, in_stage=inside)
        found = OverrideRef(
            cluster=o.cluster, effect=effect, note=o.note, revision=o.revision, rollout=rollout
        )
        if len(_refs_kept) >= REFS_KEPT:
            _refs_kept.clear()
        _refs_kept[key] = found
    return found


FLEET_HALT_POINTER = "its reason: GET /v1/overrides/*"
"""What a pod's answer reads in place of a halted fleet rollout's reason, which quotes
pods and errors of any cluster (the reason itself is read from the rollout)."""


def _halt_quoted(o: Override) -> str:
    """A halted rollout's reason as a pod's answer quotes it. The answer goes to one
    cluster's pod (and stays in its decision), so it names that cluster's pods only and
    counts the others; a fleet rollout's reason, about any cluster, and a reason stored
    as text alone (whose pods cannot be told apart) are pointed at instead."""
    r = o.rollout
    assert r is not None
    if o.cluster == "*":
        return FLEET_HALT_POINTER
    if r.halted_cause is None:
        return f"its reason: GET /v1/overrides/{o.cluster}"
    return cause_words.halt(r.halted_cause, lambda c: c == o.cluster)


def _stage_messages(a: Assessment) -> list[str]:
    out = []
    for o, inside in a.staged:
        r = o.rollout
        assert r is not None
        name = f"{o.label} rev {o.revision}"
        if r.state == "halted":
            why = _halt_quoted(o)
            out.append(f"The rollout of {name} is halted ({why}): answered as without it.")
        elif r.state == "active" and r.percent < 100:
            if inside:
                out.append(f"In the {r.percent} % rollout of {name}.")
            else:
                out.append(f"Not in the {r.percent} % rollout of {name}: answered as without it.")
    return out


def _effects(o: Override) -> list[str]:
    effects = [f"deny {b}" for b in o.deny]
    if o.force is not None:
        effects.append(f"force {o.force}")
    if o.policy is not None:
        effects.append(f"policy {o.policy}")
    return effects


def decide(
    request: SelectRequest,
    inputs: DecisionInputs,
    *,
    now: datetime,
    bucket: int | None = None,
    situation: Situation | Unknown | None = UNKNOWN,
) -> Decision | Refusal:
    """Choose a backend for ``request``; see the module docstring for precedence.
    ``bucket``: the pod's stage bucket when the caller has it (a replay of stored pods
    by group); else it is computed from the request's cluster and pod name.
    ``situation``: as for :func:`assess`."""
    deciding = _Deciding(request, inputs, assess(request, inputs, now, bucket, situation))
    # The precedence, highest first: each step answers or leaves the pod to the next.
    for step in (deciding.forced, deciding.requested, deciding.automatic):
        outcome = step()
        if outcome is not None:
            return outcome
    return deciding.fallback()


class _Deciding:
    """One ``decide`` call: the assessment, the trace so far, and the steps of precedence.

    A class rather than one long function so each step (override, request, evidence
    or priority list, fallback) reads on its own, while all of them append to the one
    trace that explains the answer.
    """

    def __init__(self, request: SelectRequest, inputs: DecisionInputs, a: Assessment) -> None:
        self.request = request
        self.inputs = inputs
        self.a = a
        self.reasons = a.reasons
        self.refs = _refs(a)
        self.described = _described(request, a.engine, a.profile)
        self.ctx = self.described.ctx
        self.trace = _Trace()
        self.trace.messages.extend(_stage_messages(a))
        self.trace.messages.extend(
            cause_words.notice(a.notices[b]) for b in _BACKENDS if b in a.notices
        )
        self.notes = self.described.notes
        self.trace.messages.extend(self.notes)
        # What the evidence was asked, reported with the outcome.
        self.read = a.situation if a.policy == "measured" else None

    def said(self, backend: Backend) -> list[str]:
        """``backend``'s reasons as a message quotes them. A message is text for the
        pod's own cluster: a measured exclusion in it names that cluster's failing pods
        only and counts the others (the candidate's reason and cause hold them all,
        rendered per reader where they leave the service)."""
        reasons = self.reasons[backend]
        cause = self.a.exclusions.get(backend)
        if cause is None:
            return reasons
        full = cause_words.exclusion(cause)
        cluster = self.request.cluster
        mine = cause_words.exclusion(cause, lambda c: c == cluster)
        return [mine if r == full else r for r in reasons]

    def choice(self, backend: Backend) -> EngineChoice:
        """How the pod's engine is told ``backend`` (``engines.choose``)."""
        return self.described.choice(backend)

    def finish(
        self, backend: Backend, source: Source, why: str, evidence: Evidence | None = None
    ) -> Decision:
        a, trace = self.a, self.trace
        choice = self.choice(backend)
        if choice.note:
            trace.messages.append(choice.note)
        return Decision(
            backend=backend,
            source=source,
            candidates=_candidates(trace, self.reasons, self.a.exclusions, self.a.notices),
            messages=tuple(trace.messages),
            overrides=self.refs,
            evidence=evidence,
            engine=a.engine,
            engine_args=choice.args,
            engine_env=tuple(sorted(choice.env.items())),
            why=why,
            evidence_situation=self.read,
        )

    def refuse(self, kind: str, message: str) -> Refusal:
        message = " ".join([message, *(f"{n}." for n in self.notes)])
        candidates = _candidates(self.trace, self.reasons, self.a.exclusions, self.a.notices)
        return Refusal(kind, message, candidates, self.refs, self.a.engine, self.read)

    def forced(self) -> Decision | None:
        """An active override's force, when the forced backend is valid here."""
        forcing = [o for o in self.a.active if o.force is not None]
        if not forcing:
            return None
        trace, reasons = self.trace, self.reasons
        force_by = forcing[-1]  # the cluster's own force beats the fleet's
        forced = force_by.force
        assert forced is not None
        trace.consider(forced, "forced")
        if not reasons[forced]:
            why = trace.say(f"Forced to {forced} by {force_by.label}: {force_by.note}")
            if self.request.requested_backend not in (None, forced):
                trace.messages.append(
                    f"Requested MLA prefill backend {self.request.requested_backend} "
                    f"was overridden by {force_by.label}."
                )
            return self.finish(forced, "override", why)
        trace.messages.append(
            f"Backend {forced} forced by {force_by.label} is not valid: "
            f"{self.said(forced)}. Skipping the override."
        )
        return None

    def requested(self) -> Decision | Refusal | None:
        """The pod's own request: used when valid, refused when invalid and strict."""
        requested = self.request.requested_backend
        if requested is None:
            return None
        trace, reasons = self.trace, self.reasons
        trace.consider(requested, "requested")
        if not reasons[requested]:
            untold = self.choice(requested).untold
            if untold is None:
                why = trace.say(f"Using requested MLA prefill backend {requested}.")
                return self.finish(requested, "requested", why)
            return self.untold(requested, untold)
        if self.request.strict:
            return self.refuse(
                "requested_invalid",
                f"Requested MLA prefill backend {requested} is not valid: "
                f"{self.said(requested)}. strict is true, so no other backend is chosen.",
            )
        trace.messages.append(
            f"Requested MLA prefill backend {requested} is not valid: "
            f"{self.said(requested)}. Falling back to auto-selection."
        )
        return None

    def untold(self, requested: Backend, untold: str) -> Refusal | None:
        """A backend the engine would run but cannot be told (its release has no flag
        for it, or no release is known): the engine decides, not the request. Strict
        asked for exactly this backend, so it is refused with the reason (also the
        candidate's); otherwise the answer goes on without it and says so."""
        said = f"Requested MLA prefill backend {requested} cannot be passed to the engine: {untold}"
        if self.request.strict:
            self.reasons[requested].append(f"the engine cannot be told it: {untold}")
            return self.refuse(
                "requested_invalid",
                f"{said}, so the engine would make its own choice. strict is true, so no "
                "other backend is chosen.",
            )
        self.trace.messages.append(f"{said}: the engine decides. Answered as if not requested.")
        return None

    def automatic(self) -> Decision | None:
        """On a GPU: the evidence (when the policy is measured), then a priority list."""
        cap = self.request.device.capability
        if cap is None:
            self.trace.messages.append("No CUDA device: using the CPU-capable fallback.")
            return None
        if self.a.policy == "measured":
            measured = self.measured()
            if measured is not None:
                return measured
        return self.listed(Capability(*cap))

    def measured(self) -> Decision | None:
        a, trace = self.a, self.trace
        evidence = self.inputs.evidence.rank(a.situation, a.valid())
        if evidence is None:
            trace.messages.append(
                "Policy is measured but the evidence for this situation is too thin; "
                "using the priority list."
            )
            return None
        trace.consider(evidence.backend, "measured")
        why = trace.say(
            f"Using {evidence.backend}: fastest correct backend measured for this "
            f"device, dims, dtype and engine ({evidence.median_tflops:.0f} TFLOP/s "
            f"median over {evidence.samples} samples from {evidence.pods} pods)."
        )
        return self.finish(evidence.backend, "measured", why, evidence)

    def listed(self, cap: Capability) -> Decision | None:
        """The first valid backend of the engine's own order or the rules' priority list."""
        a, trace = self.a, self.trace
        if a.policy == "engine-default":
            listed = a.profile.default_order(self.ctx)
            rule = f"{a.profile.label(a.engine.version)}'s own default order"
        else:
            listed, rule = priority_list(self.inputs.rules, self.request.cluster, cap)
        chosen = self.first_valid(
            listed,
            "priority",
            lambda backend: (
                f"Using {backend}: first valid backend in the priority list "
                f"({rule}: {', '.join(b.value for b in listed)})."
            ),
        )
        if chosen is not None:
            return chosen
        trace.messages.append(
            f"No backend in the priority list ({rule}: "
            f"{', '.join(b.value for b in listed) or 'empty'}) is valid."
        )
        return None

    def first_valid(
        self,
        backends: Sequence[Backend],
        source: Literal["priority", "fallback"],
        why: Callable[[Backend], str],
    ) -> Decision | None:
        """The first valid one of ``backends``, all of them listed as considered first."""
        for backend in backends:
            self.trace.consider(backend, source)
        for backend in backends:
            if not self.reasons[backend]:
                return self.finish(backend, source, self.trace.say(why(backend)))
        return None

    def fallback(self) -> Decision | Refusal:
        """The fallback chain, then any valid backend at all, else a refusal naming why."""
        trace, reasons = self.trace, self.reasons
        chosen = self.first_valid(
            FALLBACK_CHAIN, "fallback", lambda backend: f"Using fallback {backend}."
        )
        if chosen is not None:
            return chosen
        # Last resort: a valid backend outside every list beats refusing the pod, and a
        # refusal must never leave a valid candidate unexplained.
        for backend in _BACKENDS:
            if not reasons[backend]:
                trace.consider(backend, "fallback")
                why = trace.say(
                    f"Using {backend}: the only kind of backend valid for this pod "
                    "(none in the priority list or the fallback chain is)."
                )
                return self.finish(backend, "fallback", why)
        a = self.a
        engine_text = (
            "" if a.engine.name == OWN_ENGINE else f" under {a.profile.label(a.engine.version)}"
        )
        summary = "; ".join(f"{b}: {self.said(b)[0]}" for b in _BACKENDS)
        return self.refuse(
            "no_valid_backend",
            f"No MLA prefill backend is valid for this pod{engine_text}. {summary}.",
        )


def _candidates(
    trace: _Trace,
    reasons: dict[Backend, list[str]],
    exclusions: dict[Backend, MeasuredExclusion],
    notices: dict[Backend, FailureNotice],
) -> tuple[Candidate, ...]:
    """Every backend, in the order the decision considered them, then the fallback chain
    (what a pod tries if its chosen kernel fails to build), then the rest."""
    for backend in FALLBACK_CHAIN:
        trace.consider(backend, "fallback")
    for backend in _BACKENDS:
        trace.consider(backend, "unlisted")
    return tuple(
        _candidate(b, role, reasons[b], exclusions.get(b), notices.get(b))
        for b, role in trace.order
    )


CANDIDATES_KEPT = 8192
"""How many distinct candidates ``_candidate`` keeps (a backend, its role and its
reasons: a fleet has a few per description and override)."""
_candidates_kept: dict[tuple[Backend, str, tuple[str, ...], str, str], Candidate] = {}


def _candidate(
    backend: Backend,
    role: CandidateRole,
    reasons: list[str],
    exclusion: MeasuredExclusion | None = None,
    notice: FailureNotice | None = None,
) -> Candidate:
    """The candidate entry of a decision, made once per distinct (backend, role,
    reasons) and shared by every decision that has it: building the model is most of a
    decision's cost, and a fleet read makes thousands of alike decisions. A decision's
    candidates are read, never changed (the answer is a serialisation of them)."""
    # an exclusion's words hold all of it but its failures' seconds: keyed by all of it
    key = (
        backend,
        role,
        tuple(reasons),
        "" if exclusion is None else exclusion.model_dump_json(),
        "" if notice is None else notice.model_dump_json(),
    )
    found = _candidates_kept.get(key)
    if found is None:
        found = Candidate(
            backend=backend,
            valid=not reasons,
            reasons=list(reasons),
            role=role,
            exclusion=exclusion,
            failures=notice,
        )
        if len(_candidates_kept) >= CANDIDATES_KEPT:
            _candidates_kept.clear()
        _candidates_kept[key] = found
    return found


def decide_locally(request: SelectRequest) -> Decision | Refusal:
    """The agent's fail-static answer: the seed rules, no overrides, no evidence."""
    return decide(request, LOCAL_INPUTS, now=datetime.now(UTC))
