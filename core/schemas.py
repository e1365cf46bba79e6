"""The wire contract of ``/v1/select`` and the rules document, as pydantic v2 models.

These models are the single description of what a pod may send and what it gets back;
FastAPI's OpenAPI schema and ``docs/api.md`` are generated from / written against them,
and the agent builds its requests with them. Validation errors name the field and the
problem, which is why names and dtypes are parsed by functions whose ValueErrors list
the accepted values.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from mla_switchboard.core.causes import FailureNotice, HaltCause, MeasuredExclusion
from mla_switchboard.core.engine_rules.switchboard import SEED_DEFAULT, SEED_PRIORITIES
from mla_switchboard.core.engines import (
    ENGINE_NAMES,
    ENGINE_VERSION_MAX_LENGTH,
    ENGINE_VERSION_TEXT,
    OWN_ENGINE,
)
from mla_switchboard.core.hardware import UNKNOWN_PEAK_TFLOPS
from mla_switchboard.core.names import cluster_rule, validate_cluster_globs
from mla_switchboard.core.specs import (
    SPECS,
    Backend,
    BackendSpec,
    Dtype,
    KernelPackage,
    parse_backend,
    parse_dtype,
)
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    computed_field,
    field_validator,
    model_validator,
)

# 1-63 characters of [a-z0-9._-] with at least one letter or digit ("." and ".." are
# path segments, not names); the length is a separate max_length=63 (no lookahead, so
# the pattern means the same in pydantic's Rust engine, Python's re and JSON Schema).
CLUSTER_PATTERN = r"^[._-]{0,62}[a-z0-9][a-z0-9._-]{0,62}$"


def _backend(value: Any) -> Any:
    return parse_backend(value) if isinstance(value, str) else value


def _dtype(value: Any) -> Any:
    return parse_dtype(value) if isinstance(value, str) else value


BackendName = Annotated[
    Backend,
    BeforeValidator(_backend),
    Field(description="Backend name, case-insensitive: " + ", ".join(b.value for b in Backend)),
]
DtypeName = Annotated[
    Dtype,
    BeforeValidator(_dtype),
    Field(
        description="bfloat16, float16 or float32; also bf16, fp16, half, fp32, float "
        "and torch.bfloat16-style names"
    ),
]
ClusterName = Annotated[
    str,
    StringConstraints(pattern=CLUSTER_PATTERN, max_length=63),
    Field(
        description=cluster_rule(),
        examples=["prod-east"],
    ),
]
# PostgreSQL's text cannot hold NUL (U+0000): refused at the door with the field
# named, rather than failing a write (or a whole batch of decisions) in the store.
NO_NUL = r"^[^\x00]*$"
# A note or a name says something: not only whitespace (and no NUL either).
NONBLANK = r"^[^\x00]*[^\s\x00\x1c-\x1f\x85][^\x00]*$"
ShortText = Annotated[str, StringConstraints(max_length=253, pattern=NO_NUL)]
PackageName = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=NO_NUL)]
PackageVersion = Annotated[str, StringConstraints(max_length=100, pattern=NO_NUL)]


def _package_map_schema(schema: dict[str, Any]) -> None:
    """pydantic writes a key pattern as ``patternProperties``, which leaves every key
    that does not match it (one holding a NUL) unconstrained, its value too: the
    document then admitted what the server refuses. Say it as names and values."""
    schema.pop("patternProperties", None)
    schema["propertyNames"] = {"minLength": 1, "maxLength": 100, "pattern": NO_NUL}
    schema["additionalProperties"] = {"type": "string", "maxLength": 100, "pattern": NO_NUL}


PackageMap = Annotated[
    dict[PackageName, PackageVersion],
    Field(max_length=64, json_schema_extra=_package_map_schema),
]
"""Import name -> version, as pods report their kernel packages."""


def _integral(value: Any) -> Any:
    # JSON has one number type: 128.0 is the integer 128 (JSON Schema's "integer"
    # agrees, and so must we); 12.5, "128" and true stay refused by strict mode.
    # Annotate it after the Field: before it, the OpenAPI shows "gt" for
    # "exclusiveMinimum" and the bounds are lost to clients.
    return int(value) if type(value) is float and value.is_integer() else value


Integral = BeforeValidator(_integral)
# true/false only: pydantic's lax mode also takes 0, 1, "yes", "off" (the OpenAPI says boolean)
StrictBool = Annotated[bool, Field(strict=True)]


def _not_a_number(value: Any) -> Any:
    # Lax pydantic reads a number as Unix time; the contract and the OpenAPI's
    # "format": "date-time" say an ISO-8601 string.
    if isinstance(value, int | float):
        raise ValueError("expected an ISO-8601 date-time string, not a number")
    return value


IsoDateTime = Annotated[datetime, BeforeValidator(_not_a_number)]
Dim = Annotated[int, Field(gt=0, le=1024, strict=True), Integral]
Source = Literal[
    "requested",
    "priority",
    "fallback",
    "override",
    "measured",
    "cache",
    "local-fallback",
    "auth-fallback",
]
CandidateRole = Literal["forced", "requested", "measured", "priority", "fallback", "unlisted"]


class _Strict(BaseModel):
    # Unknown fields are refused: a misspelt "requested_backnd" silently ignored would
    # be a silent wrong answer. Numbers are finite: pydantic's JSON parser reads NaN,
    # Infinity and 1e400 (as inf), which no bound refuses by name ("less than or equal
    # to 100" for NaN), a field without bounds would keep, and no JSON answer can hold.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DeviceInfo(_Strict):
    name: ShortText | None = None
    capability: (
        tuple[
            Annotated[int, Field(ge=0, le=99, strict=True), Integral],
            Annotated[int, Field(ge=0, le=99, strict=True), Integral],
        ]
        | None
    ) = Field(default=None, description="[major, minor], or null for a pod without a CUDA device")


RopeDim = Annotated[int, Field(ge=0, le=1024, strict=True), Integral]


class ModelInfo(_Strict):
    name: ShortText | None = None
    qk_nope_head_dim: Dim
    qk_rope_head_dim: RopeDim = Field(description="0 for models without a rope part (GLM-5)")
    v_head_dim: Dim
    num_heads: Dim | None = None


EngineName = Literal[ENGINE_NAMES]  # type: ignore[valid-type]
"""The engines of the registry (``core/engines.py``), the only ones a request may name."""
EngineVersion = Annotated[
    str,
    StringConstraints(pattern=ENGINE_VERSION_TEXT, max_length=ENGINE_VERSION_MAX_LENGTH),
    Field(
        description="the engine's version, e.g. 0.34.0; one that cannot be read gets the "
        "newest rules, a message and only the flags every release takes",
        examples=["0.34.0"],
    ),
]


class EngineInfo(_Strict):
    """The serving engine that will run the decision; ``switchboard`` means our own
    ``kernels/`` wrappers (what a request without ``engine`` gets)."""

    name: EngineName = OWN_ENGINE
    version: EngineVersion | None = None


class SelectRequest(_Strict):
    cluster: ClusterName
    node: ShortText | None = None
    pod: ShortText | None = None
    device: DeviceInfo = Field(default_factory=DeviceInfo)
    model: ModelInfo
    dtype: DtypeName
    packages: PackageMap | None = Field(
        default=None,
        max_length=64,
        description="import name -> version; null or absent means assume every package present",
    )
    requested_backend: BackendName | None = None
    strict: StrictBool = False
    engine: EngineInfo | None = Field(
        default=None, description="the serving engine; absent means switchboard's own kernels"
    )

    @property
    def engine_name(self) -> str:
        """The engine that runs the decision: the one named, else our own kernels."""
        return self.engine.name if self.engine is not None else OWN_ENGINE


class Candidate(BaseModel):
    backend: Backend
    valid: bool
    reasons: list[str]
    role: CandidateRole
    exclusion: MeasuredExclusion | None = Field(
        default=None,
        description="when failures exclude it under policy measured: how many pods, and "
        "the newest quoted (only those of clusters the reader may see); its reason says "
        "the same in words",
    )
    failures: FailureNotice | None = Field(
        default=None,
        description="when failures were reported for it but it stays valid: fewer pods "
        "than the failure policy needs (kind measured_failures_below_policy), or kept as "
        "the one with the fewest failing pods when failures exclude every other "
        "(measured_exclusion_waived); the answer's messages say the same in words",
    )


class BackendPackage(BaseModel):
    """A package a backend imports: the name a request's ``packages`` uses, and the
    distributions (wheels) that install it, in the order the agent reads their version."""

    import_name: str
    distributions: list[str]


class BackendInfo(BaseModel):
    """One backend as the registry (``core/specs.py``) describes it: what it runs on, and
    how the dashboard shows it (``order`` in lists, ``colour`` a fixed palette slot)."""

    name: Backend
    order: int = Field(description="position in displays; the list is in this order")
    colour: int = Field(description="palette slot, fixed per backend and never reused")
    summary: str
    needs_gpu: bool
    capability: str = Field(description="compute capabilities it runs on, for people")
    capability_majors: list[int] | None = Field(
        description="the exact major versions it runs on; null: min_major or newer"
    )
    min_major: int
    dtypes: list[Dtype]
    dims: str = Field(description="MLA dims (qk_nope, qk_rope, v) it runs, for people")
    allowed_dims: list[tuple[int, int, int]] | None = Field(
        description="the exact dims it runs; null: any within the maxima"
    )
    max_qk_head_dim: int | None
    max_v_head_dim: int | None
    head_dims_by_major: dict[str, list[tuple[int, int]]] = Field(
        description="capability major -> the (qk, v) head dims it takes there, where "
        "another kernel runs (qk = qk_nope + qk_rope); a major not listed: as above"
    )
    packages: list[BackendPackage] = Field(description="needed: it cannot build without them")
    optional_packages: list[BackendPackage] = Field(
        description="used when present; their versions split measurements like the needed ones"
    )


class BackendsDocument(BaseModel):
    """``GET /v1/backends``: every backend this service knows, in display order."""

    backends: list[BackendInfo]


def _package_info(package: KernelPackage) -> BackendPackage:
    return BackendPackage(
        import_name=package.import_name, distributions=list(package.distributions)
    )


def _backend_info(order: int, spec: BackendSpec) -> BackendInfo:
    return BackendInfo(
        name=spec.backend,
        order=order,
        colour=spec.colour,
        summary=spec.summary,
        needs_gpu=spec.needs_gpu,
        capability=spec.capability_text,
        capability_majors=None
        if spec.capability_majors is None
        else sorted(spec.capability_majors),
        min_major=spec.min_major,
        dtypes=[d for d in Dtype if d in spec.dtypes],
        dims=spec.dims_text,
        allowed_dims=None
        if spec.allowed_dims is None
        else sorted(
            (d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim) for d in spec.allowed_dims
        ),
        max_qk_head_dim=spec.max_qk_head_dim,
        max_v_head_dim=spec.max_v_head_dim,
        head_dims_by_major={
            str(major): sorted(pairs) for major, pairs in sorted(spec.head_dims_by_major.items())
        },
        packages=[_package_info(p) for p in spec.packages],
        optional_packages=[_package_info(p) for p in spec.optional_packages],
    )


def backends_document() -> BackendsDocument:
    """The backend registry as the API gives it: one entry per backend, in the order
    ``Backend`` lists them (the order every display uses)."""
    return BackendsDocument(backends=[_backend_info(i, SPECS[b]) for i, b in enumerate(Backend)])


class RolloutRef(BaseModel):
    """The stage of a staged override, as a decision saw it."""

    id: str
    percent: int
    state: str
    in_stage: bool


class OverrideRef(BaseModel):
    """An override that touched a decision, and what it did to it (``effect`` is
    "none" for a pod outside a staged override's rollout, or a halted one)."""

    cluster: str
    effect: str
    note: str
    revision: int | None = None
    rollout: RolloutRef | None = None

    @property
    def label(self) -> str:
        return override_label(self.cluster)


def override_label(scope: str) -> str:
    """How messages name the override of ``scope`` (a cluster, or ``*``)."""
    return "fleet override (*)" if scope == FLEET else f"override {scope}"


class Evidence(BaseModel):
    """What measured selection based a decision on."""

    backend: Backend
    median_tflops: float
    samples: int
    pods: int
    runner_up: Backend | None = None
    runner_up_tflops: float | None = None
    margin: float | None = None


class SelectResponse(BaseModel):
    backend: Backend
    source: Source
    candidates: list[Candidate]
    messages: list[str]
    rules_revision: int
    decision_id: str | None
    recorded: bool = Field(
        default=True,
        description="false: the service did not keep this decision (a dry run, or its "
        "buffer full and its spill file unable to take more); decision_id is then null",
    )
    overrides: list[OverrideRef] = Field(default_factory=list)
    evidence: Evidence | None = None
    engine: EngineInfo = Field(default_factory=EngineInfo)
    engine_args: list[str] = Field(
        default_factory=list, description="argv to append to the engine's command line"
    )
    engine_env: dict[str, str] = Field(
        default_factory=dict, description="environment variables the engine needs"
    )


# ------------------------------------------------------------------ error answers


class ErrorMessage(BaseModel):
    """``detail`` of an error answer other than 422: what went wrong; some errors add
    fields (a 412's ``current_etag``)."""

    model_config = ConfigDict(extra="allow")
    message: str


class ErrorBody(BaseModel):
    detail: ErrorMessage


_ERRORS = {
    401: "missing or unknown token",
    403: "the token lacks the role, or is limited to other clusters",
    404: "not found",
    409: "the resource's state does not allow it (the message says why); nothing changed",
    412: "If-Match is stale; nothing changed",
    413: "request body over the size limit (64 KiB)",
    429: "a wrong token from a client address that sent too many in the last minute; "
    "Retry-After says when to try again (a valid token is never throttled)",
    503: "the store is unavailable; nothing changed unless the message says the outcome "
    "is unknown (then retry with the same Idempotency-Key)",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for error answers shaped ``{"detail": {"message"}}``,
    so that the document lists every status a route can answer (a route that checks a
    token, 401, can answer 429 to a wrong one too)."""
    if 401 in codes and 429 not in codes:
        codes = (*codes, 429)
    return {code: {"model": ErrorBody, "description": _ERRORS[code]} for code in codes}


# --------------------------------------------------------------------------- rules

_CAPABILITY_KEY = re.compile(r"^[0-9]{1,2}(\.[0-9]{1,2})?$")


def _unique(backends: list[Backend]) -> list[Backend]:
    seen: set[Backend] = set()
    for backend in backends:
        if backend in seen:
            raise ValueError(f"backend {backend} listed twice")
        seen.add(backend)
    return backends


# The json_schema_extra below put into the OpenAPI what the validators enforce, so
# that a request valid by the schema is one the service accepts (schemathesis).
PriorityList = Annotated[
    list[BackendName], Field(max_length=len(Backend), json_schema_extra={"uniqueItems": True})
]


class RuleSet(_Strict):
    """Priority lists: ``by_capability`` keys are a major (``"10"``) or ``"major.minor"``;
    ``default`` applies to every other CUDA capability. A ``major.minor`` key beats a
    major key, which beats ``default``."""

    default: PriorityList = Field(default_factory=list)
    by_capability: dict[str, PriorityList] = Field(
        default_factory=dict,
        json_schema_extra={"propertyNames": {"pattern": _CAPABILITY_KEY.pattern}},
    )

    @field_validator("default")
    @classmethod
    def _default_unique(cls, value: list[Backend]) -> list[Backend]:
        return _unique(value)

    @field_validator("by_capability")
    @classmethod
    def _keys(cls, value: dict[str, list[Backend]]) -> dict[str, list[Backend]]:
        for key, backends in value.items():
            if not _CAPABILITY_KEY.match(key):
                raise ValueError(
                    f"capability key {key!r} must be a major ('10') or 'major.minor' ('9.0')"
                )
            _unique(backends)
        return value


class ClusterRuleSet(RuleSet):
    """A cluster's own rules; ``default`` null means fall through to the fleet rules."""

    default: PriorityList | None = None  # type: ignore[assignment]

    @field_validator("default")
    @classmethod
    def _default_unique(cls, value: list[Backend] | None) -> list[Backend] | None:
        return None if value is None else _unique(value)


class RulesDocument(RuleSet):
    """What ``GET /v1/rules`` returns and ``PUT /v1/rules`` accepts (round-trippable)."""

    revision: Annotated[int, Field(strict=True), Integral] | None = Field(
        default=None, description="ignored on PUT (the server bumps it); use If-Match"
    )
    updated_at: IsoDateTime | None = None
    clusters: dict[ClusterName, ClusterRuleSet] = Field(
        default_factory=dict, json_schema_extra={"additionalProperties": False}
    )

    def rules_only(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"revision", "updated_at"})


SEED_RULES = RulesDocument(
    revision=1,
    default=list(SEED_DEFAULT),
    by_capability={key: list(order) for key, order in SEED_PRIORITIES.items()},
)
"""vLLM-compatible priorities: Blackwell gets the specialised kernels, everything else
FLASH_ATTN (see shared/seed for the excerpt these reproduce). The lists are
Switchboard's own default order (``core/engine_rules/switchboard.py``)."""


# ----------------------------------------------------------------------- overrides

# Cluster globs (a token's scope, an override's trust_clusters): one rule, in
# core/names.py, for the API and the CLI; the pattern says the same in JSON Schema
# (a letter, digit or * somewhere, 1-63 characters: the length is max_length).
CLUSTER_GLOB_PATTERN = r"^[?._-]{0,62}[a-z0-9*][a-z0-9*?._-]{0,62}$"
ClusterGlobs = Annotated[
    list[Annotated[str, StringConstraints(pattern=CLUSTER_GLOB_PATTERN, max_length=63)]],
    Field(min_length=1, max_length=64, description="cluster globs (prod-*), at least one"),
    AfterValidator(validate_cluster_globs),
]

FLEET = "*"
OVERRIDE_SCOPE_PATTERN = r"^(\*|[._-]{0,62}[a-z0-9][a-z0-9._-]{0,62})$"
OverrideScope = Annotated[
    str,
    StringConstraints(pattern=OVERRIDE_SCOPE_PATTERN, max_length=63),
    Field(description="a cluster name, or * for the whole fleet"),
]
Policy = Literal["priority", "measured", "engine-default"]

_DURATION = re.compile(r"^([1-9][0-9]{0,5})(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
Duration = Annotated[
    str,
    StringConstraints(pattern=_DURATION.pattern),
    Field(description="a duration: a whole number and s, m, h or d, e.g. 30m", examples=["30m"]),
]


def duration_seconds(text: str) -> float:
    """``"30m"`` -> 1800.0 (the pattern above has already been checked)."""
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(f"not a duration: {text!r} (e.g. 45s, 30m, 2h, 1d)")
    return float(int(m.group(1)) * _UNIT_S[m.group(2)])


Percent = Annotated[int, Field(ge=1, le=100, strict=True), Integral]


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected a number")
    return value


class RolloutSpec(_Strict):
    """A staged override: it applies to ``percent`` % of the scope's named pods, chosen
    by a stable hash of (cluster, pod name, rollout id), and halts by itself when pods
    in the stage report failures or measure slower than they would run without it."""

    percent: Percent = Field(description="1-100: the share of named pods in the stage")
    max_failures: Annotated[int, Field(ge=1, le=10_000, strict=True), Integral] = Field(
        default=1,
        description="distinct stage pods reporting a failure of what the rollout gave them "
        "(decided since the stage began) that halt it; a pod's repeated reports count once",
    )
    guard_clusters: ClusterGlobs | None = Field(
        default=None,
        description="cluster globs whose stage pods may halt the rollout (failures and "
        "slowdowns); null (the default) = every cluster the rollout covers",
    )
    max_slowdown_pct: Annotated[float, Field(gt=0, le=100), BeforeValidator(_number)] = Field(
        default=5.0,
        description="halt when stage pods measure their backend this much slower than the "
        "one they would run without the override (at least 3 samples from 2 pods)",
    )
    steps: list[Percent] | None = Field(
        default=None,
        min_length=1,
        max_length=20,
        description="percentages to promote through, increasing; needs step_every",
    )
    step_every: Duration | None = Field(
        default=None, description="promote to the next step after this long with no guard fired"
    )

    @model_validator(mode="after")
    def _steps(self) -> RolloutSpec:
        if (self.steps is None) != (self.step_every is None):
            raise ValueError("steps and step_every go together: give both or neither")
        if self.steps is not None:
            if any(b <= a for a, b in itertools.pairwise(self.steps)):
                raise ValueError("steps must be strictly increasing")
            if self.steps[-1] < self.percent:
                raise ValueError("the last step must be at least percent")
        return self


RolloutState = Literal["active", "halted", "complete"]


class Rollout(RolloutSpec):
    """A rollout as stored and shown: the spec plus its state."""

    model_config = ConfigDict(extra="ignore")

    id: str
    state: RolloutState = "active"
    stage_started_at: datetime | None = None
    halted_reason: str | None = None
    halted_cause: HaltCause | None = Field(
        default=None,
        description="why it halted, as data: kind, pods, error, figures (halted_reason: "
        "the same in words, as this caller may read them)",
    )
    halted_at: datetime | None = None
    failures: int = 0
    # "cluster/pod" of the stage pods whose failures count in this stage (as named)
    failed_pods: list[str] = Field(default_factory=list)
    # what ``failures`` counts: each distinct evidence source of a counted failure,
    # "pod:<uid>" (a verified pod) or "token:<id>" (a static token, however many pods
    # it named) or "name:<cluster>/<pod>" (a decision recorded before askers were kept)
    failure_sources: list[str] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def evidence(self) -> dict[str, int]:
        """How much of what the failure guard counted is verified: distinct verified
        pods and distinct static sources (tokens, or old unattributed decisions)."""
        verified = sum(1 for s in set(self.failure_sources) if s.startswith("pod:"))
        return {
            "verified_pods": verified,
            "static_sources": len(set(self.failure_sources)) - verified,
        }


class OverrideSpec(_Strict):
    """What a platform engineer writes with ``PUT /v1/overrides/{cluster}``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={  # at least one of force, deny, policy (see _consistent)
            "anyOf": [
                {"required": ["force"], "properties": {"force": {"not": {"type": "null"}}}},
                {"required": ["deny"], "properties": {"deny": {"minItems": 1}}},
                {"required": ["policy"], "properties": {"policy": {"not": {"type": "null"}}}},
            ]
        },
    )

    force: BackendName | None = None
    deny: list[BackendName] = Field(
        default_factory=list,
        max_length=len(Backend),
        json_schema_extra={
            "uniqueItems": True,
            "items": {"enum": [b.value for b in Backend if b is not Backend.TORCH_SDPA]},
        },
    )
    model: (
        Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=NO_NUL)] | None
    ) = Field(default=None, description="fnmatch glob on model.name; null matches every model")
    expires_at: IsoDateTime | None = Field(
        default=None, description="ISO-8601; without a timezone it is taken as UTC"
    )
    note: Annotated[
        str,
        StringConstraints(strip_whitespace=True, min_length=1, max_length=2000, pattern=NONBLANK),
    ]
    rollout: RolloutSpec | None = Field(
        default=None, description="stage the override: apply it to a share of the pods first"
    )
    policy: Policy | None = Field(
        default=None,
        description="selection policy for this scope: priority (the rules), measured "
        "(the fleet's benchmarks), engine-default (the serving engine's own order)",
    )
    trust_clusters: ClusterGlobs | None = Field(
        default=None,
        description="under policy measured: the cluster globs whose benchmarks this scope's "
        "pods trust; null (the default) = only the pod's own cluster",
    )

    @field_validator("deny")
    @classmethod
    def _deny(cls, value: list[Backend]) -> list[Backend]:
        _unique(value)
        if Backend.TORCH_SDPA in value:
            raise ValueError(
                f"{Backend.TORCH_SDPA} is the last-resort fallback and cannot be denied"
            )
        return value

    @field_validator("expires_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> OverrideSpec:
        if self.force is not None and self.force in self.deny:
            raise ValueError(f"force {self.force} is also in deny")
        if self.force is None and not self.deny and self.policy is None:
            raise ValueError("an override needs at least one of force, deny or policy")
        return self


class Override(OverrideSpec):
    """A stored override as the API shows it."""

    model_config = ConfigDict(extra="ignore")

    cluster: str
    created_at: datetime
    created_by: str
    revision: int
    expired: bool = False
    rollout: Rollout | None = None  # type: ignore[assignment]

    @property
    def label(self) -> str:
        return override_label(self.cluster)


def rollout_id(cluster: str, spec: OverrideSpec) -> str:
    """A stable id for the rollout of ``spec`` on ``cluster``, derived from what the
    override does: raising ``percent`` keeps every pod that was in the stage, a preview
    and the write it previews choose the same pods, and changing the effect starts a
    new rollout."""
    effect = {
        "cluster": cluster,
        "force": spec.force,
        "deny": sorted(b.value for b in spec.deny),
        "policy": spec.policy,
        "model": spec.model,
    }
    raw = json.dumps(effect, sort_keys=True).encode()
    return hashlib.blake2b(raw, digest_size=6).hexdigest()


# -------------------------------------------------------------------- measurements

ShapeSeqlens = Annotated[
    list[Annotated[int, Field(gt=0, le=1_048_576, strict=True), Integral]],
    Field(min_length=1, max_length=4096),
]


class MeasuredShape(_Strict):
    seqlens: ShapeSeqlens
    num_heads: Dim


class MeasurementResult(_Strict):
    """One backend on one shape, as measured on the pod's own GPU."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={  # what _complete checks, in the OpenAPI
            "anyOf": [
                {"properties": {"correct": {"const": False}}},
                {"required": ["error"], "properties": {"error": {"type": "string"}}},
                {
                    "required": ["median_ms", "tflops"],
                    "properties": {"median_ms": {"type": "number"}, "tflops": {"type": "number"}},
                },
            ]
        },
    )

    backend: BackendName
    impl: Annotated[str, StringConstraints(max_length=100, pattern=NO_NUL)] | None = Field(
        default=None, description="the code path really used, e.g. flashinfer-fa3"
    )
    shape: MeasuredShape
    median_ms: Annotated[float, Field(gt=0, lt=3_600_000, strict=True)] | None = None
    tflops: (
        Annotated[
            float,
            Field(
                ge=0,
                le=UNKNOWN_PEAK_TFLOPS,
                strict=True,
                description="at most the GPU's dense bf16 peak (core/hardware.py)",
            ),
        ]
        | None
    ) = None
    correct: StrictBool
    error: Annotated[str, StringConstraints(max_length=8000, pattern=NO_NUL)] | None = None

    @model_validator(mode="after")
    def _complete(self) -> MeasurementResult:
        if self.correct and self.error is None and (self.median_ms is None or self.tflops is None):
            raise ValueError("a correct result needs median_ms and tflops")
        return self


class MeasurementReport(_Strict):
    """What ``switchboard bench`` posts to ``POST /v1/measurements``."""

    report_id: Annotated[str, StringConstraints(pattern=r"^[0-9A-Za-z_-]{8,26}$")] | None = Field(
        default=None,
        description="chosen by the agent; a retried report with the same id is stored once",
    )
    cluster: ClusterName
    pod: ShortText
    node: ShortText | None = None
    device: DeviceInfo
    model: ModelInfo
    dtype: DtypeName
    packages: PackageMap = Field(default_factory=dict)
    engine: EngineInfo | None = Field(
        default=None, description="the engine whose code paths were measured"
    )
    results: list[MeasurementResult] = Field(min_length=1, max_length=256)
