"""``select_backend``: describe the pod, ask the service, fail static, build the kernel.

The one promise that shapes everything here: a serving pod always gets a valid
backend within the deadline. The service is the source of truth while it answers;
when it does not (down, slow, refusing our token), the pod boots on the last answer
the service gave for the same situation (``source: cache``), else on the very same
decision engine the service runs, with its seed rules (``source: local-fallback``).
Only two things stop a pod: a description that is wrong (not an MLA model: bad input)
and a decision that refuses on purpose (``strict`` with an invalid request).

The deadline bounds the time spent obtaining the decision (cache, service, local
fallback); probing the device and reading the config happen before it starts, since
they are local and the serving engine pays for the same torch import anyway.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mla_switchboard.agent.cache import AnswerCache, default_cache_dir
from mla_switchboard.agent.client import (
    DEFAULT_DEADLINE_S,
    ServiceRefused,
    ServiceUnavailable,
    ask_service,
    deadline_from_env,
    parse_urls,
    report_failure,
    token_from_env,
)
from mla_switchboard.agent.errors import BadInputError, NoBackendError
from mla_switchboard.agent.instantiate import KernelShape, build_kernel, build_order
from mla_switchboard.agent.model_config import ModelDims, read_model
from mla_switchboard.agent.notes import Notes
from mla_switchboard.agent.probe import DeviceProbe, probe_device, probe_packages
from mla_switchboard.core.evaluator import SEED_RULES, Refusal, decide_locally
from mla_switchboard.core.schemas import Candidate, SelectRequest, SelectResponse
from mla_switchboard.core.specs import Backend, Dtype, parse_backend
from pydantic import ValidationError

__all__ = ["PodDescription", "SelectionResult", "decide", "describe_pod", "select_backend"]

DEFAULT_DTYPE = Dtype.BFLOAT16
FALLBACK_RESERVE_S = 0.02
"""Kept back from the service's share of the deadline for the local fallback (~1 ms)."""

PackagesArg = Mapping[str, str] | Literal["any", "probe"] | None


@dataclass(frozen=True)
class PodDescription:
    """What the agent tells the service, and what it learnt on the way."""

    request: SelectRequest
    model: ModelDims
    device: DeviceProbe
    pretend: bool  # capability or device name given: a dry run, nothing is built


@dataclass
class SelectionResult:
    """The backend the pod should run, why, and (Python API) the built kernel.

    ``source`` is what the service said (``priority``, ``requested``, ``fallback``,
    ``override``, ``measured``) or ``cache`` / ``local-fallback`` when the agent
    answered alone. ``backend`` is the one that was built; it differs from
    ``decided_backend`` only when the decided one failed to build here.
    ``revalidated``: the service confirmed the cached answer (HTTP 304).
    """

    backend: Backend
    source: str
    candidates: list[Candidate]
    messages: list[str]
    decision_id: str | None
    rules_revision: int | None
    request: SelectRequest
    decided_backend: Backend
    notes: list[str] = field(default_factory=list)
    kernel: Any = None
    build_failures: list[tuple[str, str]] = field(default_factory=list)
    service_url: str | None = None
    cached_source: str | None = None
    revalidated: bool = False
    pretend: bool = False
    evidence: dict[str, Any] | None = None  # what measured selection based the answer on

    @property
    def reasons(self) -> dict[str, list[str]]:
        """Why each backend the decision ruled out cannot run here."""
        return {c.backend.value: list(c.reasons) for c in self.candidates if not c.valid}

    def to_dict(self) -> dict[str, Any]:
        """The ``--format json`` document."""
        return {
            "backend": self.backend.value,
            "source": self.source,
            "decided_backend": self.decided_backend.value,
            "decision_id": self.decision_id,
            "rules_revision": self.rules_revision,
            "candidates": [c.model_dump(mode="json") for c in self.candidates],
            "messages": list(self.messages),
            "notes": list(self.notes),
            "cached_source": self.cached_source,
            "revalidated": self.revalidated,
            "service_url": self.service_url,
            "kernel": None if self.kernel is None else getattr(self.kernel, "impl", "built"),
            "build_failures": [{"backend": b, "error": e} for b, e in self.build_failures],
            "pretend": self.pretend,
            "evidence": self.evidence,
            "request": self.request.model_dump(mode="json"),
        }


# ------------------------------------------------------------------ describing


def _parse_capability(value: str | Sequence[int]) -> tuple[int, int] | None:
    """``"9.0"``, ``"10"``, ``(9, 0)``; ``"none"`` pretends there is no GPU."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("none", "null", "cpu", ""):
            return None
        major, _, minor = text.partition(".")
        try:
            return int(major), int(minor or 0)
        except ValueError:
            raise BadInputError(
                f"capability {value!r} is not major.minor (e.g. 9.0) or 'none'"
            ) from None
    parts = tuple(value)
    if len(parts) != 2 or not all(isinstance(p, int) for p in parts):
        raise BadInputError(f"capability {value!r} is not a (major, minor) pair")
    return parts[0], parts[1]


def parse_packages(spec: str) -> PackagesArg:
    """``torch=2.11.0,flashinfer=0.7.2``, ``any`` (assume all present) or ``probe``."""
    text = spec.strip()
    if text.lower() in ("any", "probe"):
        return text.lower()  # type: ignore[return-value]
    packages: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, version = item.partition("=")
        if not name.strip():
            raise BadInputError(f"package entry {item!r} has no name (want name=version)")
        packages[name.strip()] = version.strip() or "unknown"
    return packages


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "request"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def describe_pod(
    model: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    cluster: str | None = None,
    dtype: str | Dtype | None = None,
    requested_backend: str | Backend | None = None,
    strict: bool = False,
    qk_nope_head_dim: int | None = None,
    qk_rope_head_dim: int | None = None,
    v_head_dim: int | None = None,
    num_heads: int | None = None,
    model_name: str | None = None,
    capability: str | Sequence[int] | None = None,
    device_name: str | None = None,
    packages: PackagesArg = None,
    node: str | None = None,
    pod: str | None = None,
    notes: Notes | None = None,
) -> PodDescription:
    """Probe the pod and read the model into the request the service expects.

    ``capability``/``device_name`` pretend to be another GPU (a dry run). ``packages``
    None probes them, except in a dry run, where it means ``"any"`` (assume every
    package present: the packages of this machine say nothing about the pretended
    one). Raises BadInputError for anything that makes the description wrong.
    """
    notes = notes if notes is not None else Notes()
    cluster = cluster or os.environ.get("SWITCHBOARD_CLUSTER")
    if not cluster:
        raise BadInputError("no cluster given (--cluster or SWITCHBOARD_CLUSTER)")
    if model is None and None in (qk_nope_head_dim, qk_rope_head_dim, v_head_dim):
        raise BadInputError(
            "no model given: pass a config.json or model directory, or all three of "
            "qk_nope_head_dim, qk_rope_head_dim and v_head_dim"
        )
    dims = read_model(
        None if isinstance(model, Mapping) else model,
        config=model if isinstance(model, Mapping) else None,
        qk_nope_head_dim=qk_nope_head_dim,
        qk_rope_head_dim=qk_rope_head_dim,
        v_head_dim=v_head_dim,
        num_heads=num_heads,
        dtype=dtype,
        name=model_name,
    )
    requested: Backend | None = None
    if requested_backend is not None:
        try:
            requested = parse_backend(str(requested_backend))
        except ValueError as exc:
            raise BadInputError(str(exc)) from None
    pretend = capability is not None or device_name is not None
    given_capability = _parse_capability(capability) if capability is not None else None
    model_dtype = dims.dtype
    if model_dtype is None:
        model_dtype = DEFAULT_DTYPE
        notes.info(f"the model config names no dtype; assuming {DEFAULT_DTYPE}")

    # Only now the probes, which import torch: bad input fails fast.
    if capability is not None:
        device = DeviceProbe(name=device_name, capability=given_capability, via="given")
    else:
        device = probe_device()
        if device_name is not None:
            device = DeviceProbe(name=device_name, capability=device.capability, via="given")

    if packages is None:
        packages = "any" if pretend else "probe"
    if packages == "probe":
        found, problems = probe_packages()
        for problem in problems:
            notes.warn(problem)
        package_map: dict[str, str] | None = found
    elif packages == "any":
        package_map = None
    else:
        package_map = dict(packages)

    hostname = socket.gethostname() or None
    try:
        request = SelectRequest(
            cluster=cluster,
            node=node or os.environ.get("SWITCHBOARD_NODE") or None,
            pod=pod or os.environ.get("SWITCHBOARD_POD") or hostname,
            device={"name": device.name, "capability": device.capability},
            model={
                "name": dims.name,
                "qk_nope_head_dim": dims.qk_nope_head_dim,
                "qk_rope_head_dim": dims.qk_rope_head_dim,
                "v_head_dim": dims.v_head_dim,
                "num_heads": dims.num_heads,
            },
            dtype=model_dtype,
            packages=package_map,
            requested_backend=requested,
            strict=strict,
        )
    except ValidationError as exc:
        raise BadInputError(f"invalid pod description: {_validation_message(exc)}") from None
    return PodDescription(request=request, model=dims, device=device, pretend=pretend)


# -------------------------------------------------------------------- deciding


@dataclass(frozen=True)
class _Answer:
    response: SelectResponse
    url: str | None
    cached_source: str | None = None
    revalidated: bool = False


def _local_answer(request: SelectRequest) -> _Answer:
    outcome = decide_locally(request)
    if isinstance(outcome, Refusal):
        candidates = [c.model_dump(mode="json") for c in outcome.candidates]
        raise NoBackendError(outcome.message, candidates)
    response = outcome.to_response(rules_revision=SEED_RULES.revision or 0, decision_id=None)
    return _Answer(response.model_copy(update={"source": "local-fallback"}), None)


def decide(
    request: SelectRequest,
    *,
    urls: Sequence[str],
    token: str | None,
    deadline_s: float,
    cache: AnswerCache | None,
    notes: Notes,
) -> _Answer:
    """The service's answer, else the cached one, else the local engine's, in
    ``deadline_s``. Raises NoBackendError when the decision is a refusal."""
    started = time.monotonic()
    entry = None
    if cache is not None:
        entry, problem = cache.load(request)
        if problem:
            notes.warn(problem)

    why: str
    if not urls:
        why = "no service URL configured (SWITCHBOARD_URL or --url)"
    else:
        budget = deadline_s - (time.monotonic() - started) - FALLBACK_RESERVE_S
        try:
            asked = ask_service(
                request,
                urls=urls,
                token=token,
                deadline_s=max(0.0, budget),
                etag=entry.etag if entry is not None else None,
            )
        except ServiceRefused as exc:
            if exc.status == 409:
                raise NoBackendError(exc.message, exc.candidates) from None
            why = f"the service refused the request ({exc})"
        except ServiceUnavailable as exc:
            tried = ""
            if exc.attempts:
                tried = f" after {len(exc.attempts)} attempts (last: {exc.attempts[-1]})"
            why = f"the service did not answer: {exc}{tried}"
        else:
            if asked.response is None:  # 304: our cached answer still holds
                assert entry is not None
                response = entry.response.model_copy(update={"decision_id": asked.decision_id})
                return _Answer(response, asked.url, revalidated=True)
            if cache is not None:
                problem = cache.store(request, asked.response, asked.etag, asked.url)
                if problem:
                    notes.warn(problem)
            return _Answer(asked.response, asked.url)

    if entry is not None:
        notes.warn(
            f"{why}; using the answer {entry.url or 'the service'} gave, cached "
            f"{entry.age_s:.0f}s ago"
        )
        response = entry.response.model_copy(update={"source": "cache"})
        return _Answer(response, None, cached_source=entry.response.source)
    notes.warn(f"{why}; deciding locally with the seed rules")
    return _local_answer(request)


# ------------------------------------------------------------------- selecting


def select_backend(
    model: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    cluster: str | None = None,
    dtype: str | Dtype | None = None,
    requested_backend: str | Backend | None = None,
    strict: bool = False,
    qk_nope_head_dim: int | None = None,
    qk_rope_head_dim: int | None = None,
    v_head_dim: int | None = None,
    num_heads: int | None = None,
    model_name: str | None = None,
    capability: str | Sequence[int] | None = None,
    device_name: str | None = None,
    packages: PackagesArg = None,
    node: str | None = None,
    pod: str | None = None,
    urls: Sequence[str] | str | None = None,
    token: str | None = None,
    deadline: float | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    build: bool = True,
    check: bool = False,
) -> SelectionResult:
    """Choose this pod's MLA prefill backend and (by default) build its kernel.

    ``model`` is a ``config.json`` path, a model directory or a parsed config;
    the dim arguments override it. Service settings default to ``SWITCHBOARD_URL``
    (comma-separated, tried in turn), ``SWITCHBOARD_TOKEN`` and
    ``SWITCHBOARD_DEADLINE`` (seconds, default 2); the cache to
    ``$SWITCHBOARD_CACHE_DIR`` or ``$XDG_CACHE_HOME/switchboard``.

    Raises BadInputError (not an MLA model, unreadable config, bad argument),
    NoBackendError (a strict request that is invalid) or KernelBuildError (nothing,
    not even TORCH_SDPA, builds).
    """
    notes = Notes()
    url_list = parse_urls(urls) if isinstance(urls, str) or urls is None else list(urls)
    token = token if token is not None else token_from_env()
    if deadline is None:
        try:
            deadline = deadline_from_env(DEFAULT_DEADLINE_S)
        except ValueError as exc:
            raise BadInputError(f"SWITCHBOARD_DEADLINE: {exc}") from None
    if not deadline > 0:
        raise BadInputError(f"deadline must be positive, got {deadline!r}")
    pod_description = describe_pod(
        model,
        cluster=cluster,
        dtype=dtype,
        requested_backend=requested_backend,
        strict=strict,
        qk_nope_head_dim=qk_nope_head_dim,
        qk_rope_head_dim=qk_rope_head_dim,
        v_head_dim=v_head_dim,
        num_heads=num_heads,
        model_name=model_name,
        capability=capability,
        device_name=device_name,
        packages=packages,
        node=node,
        pod=pod,
        notes=notes,
    )
    request = pod_description.request
    building = build and not pod_description.pretend
    if building and pod_description.model.num_heads is None:
        raise BadInputError("num_attention_heads is needed to build the kernel; pass num_heads")

    cache = None
    if use_cache:
        directory = cache_dir or os.environ.get("SWITCHBOARD_CACHE_DIR") or default_cache_dir()
        cache = AnswerCache(directory)

    answer = decide(
        request, urls=url_list, token=token, deadline_s=deadline, cache=cache, notes=notes
    )
    response = answer.response
    result = SelectionResult(
        backend=response.backend,
        source=response.source,
        candidates=list(response.candidates),
        messages=list(response.messages),
        decision_id=response.decision_id,
        rules_revision=response.rules_revision,
        request=request,
        decided_backend=response.backend,
        notes=notes,
        service_url=answer.url,
        cached_source=answer.cached_source,
        revalidated=answer.revalidated,
        pretend=pod_description.pretend,
        evidence=None if response.evidence is None else response.evidence.model_dump(mode="json"),
    )
    if pod_description.pretend and (build or check):
        notes.info("pretending to be another GPU (--capability/--device-name): nothing is built")
    if not building:
        return result

    dims = pod_description.model
    shape = KernelShape(
        num_heads=dims.num_heads or 0,
        qk_nope_head_dim=dims.qk_nope_head_dim,
        qk_rope_head_dim=dims.qk_rope_head_dim,
        v_head_dim=dims.v_head_dim,
        softmax_scale=dims.softmax_scale,
        dtype=request.dtype,
        device="cpu" if request.device.capability is None else "cuda",
    )

    def on_failure(backend: Backend, error: str) -> None:
        if result.decision_id is None or not url_list:
            return
        problem = report_failure(
            result.decision_id, backend.value, error, urls=url_list, token=token
        )
        if problem is not None:
            notes.warn(f"could not report the {backend} failure to the service: {problem}")

    outcome = build_kernel(
        build_order(response.backend, response.candidates),
        shape,
        notes=notes,
        check=check,
        on_failure=on_failure,
    )
    result.backend = outcome.backend
    result.kernel = outcome.kernel
    result.build_failures = [(b.value, why) for b, why in outcome.failures]
    if outcome.failures:
        notes.warn(f"using {outcome.backend} instead of {response.backend}")
    return result
