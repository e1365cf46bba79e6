"""The pod's description: one ``PodSpec`` value in, one ``SelectRequest`` out.

``select``, ``bench``, ``select --measure`` and the Python API all describe the same
thing (the model, the cluster, the GPU, the packages, the serving engine), so they
share one frozen value instead of a score of keyword arguments repeated in each.
:func:`describe_pod` turns it into the request the service expects, probing what
the spec leaves open; every input that makes the description wrong raises
BadInputError before the service is asked anything.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mla_switchboard.agent.engine import resolve_engine
from mla_switchboard.agent.errors import BadInputError
from mla_switchboard.agent.model_config import ModelDims, read_model
from mla_switchboard.agent.notes import Notes
from mla_switchboard.agent.probe import DeviceProbe, probe_device, probe_packages
from mla_switchboard.agent.settings import CLUSTER, AgentSettings, TokenFile
from mla_switchboard.agent.workload_token import pod_name_of
from mla_switchboard.core.names import cluster_name_problem
from mla_switchboard.core.schemas import DeviceInfo, EngineInfo, ModelInfo, SelectRequest
from mla_switchboard.core.specs import Backend, Dtype, parse_backend
from pydantic import ValidationError

__all__ = [
    "DEFAULT_DTYPE",
    "ModelSource",
    "PackagesArg",
    "PodDescription",
    "PodSpec",
    "describe_pod",
    "parse_capability",
    "parse_packages",
]

DEFAULT_DTYPE = Dtype.BFLOAT16

ModelSource = str | os.PathLike[str] | Mapping[str, Any] | None
"""A ``config.json`` path, a model directory, an already parsed config, or None (the
three dims given explicitly)."""
PackagesArg = Mapping[str, str] | Literal["any", "probe"] | None
"""Kernel packages: a map (import name -> version), ``any`` (assume every package
present), ``probe`` (import them here) or None (probe, or ``any`` in a dry run)."""

_PACKAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_PACKAGE_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]{0,99}$")


@dataclass(frozen=True)
class PodSpec:
    """What the caller says about the pod; None fields are read, probed or defaulted.

    ``capability``/``device_name`` pretend to be another GPU (a dry run: nothing is
    built, nothing measured). ``engine`` None detects the installed engine; a string
    is parsed like ``--engine`` (``vllm==0.33.0``, ``switchboard``).
    """

    model: ModelSource = None
    cluster: str | None = None
    dtype: str | Dtype | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    num_heads: int | None = None
    model_name: str | None = None
    node: str | None = None
    pod: str | None = None
    engine: EngineInfo | str | None = None
    requested_backend: str | Backend | None = None
    strict: bool = False
    capability: str | Sequence[int] | None = None
    device_name: str | None = None
    packages: PackagesArg = None

    @property
    def pretend(self) -> bool:
        """A dry run: the GPU is given, not probed."""
        return self.capability is not None or self.device_name is not None

    def read_model(self) -> ModelDims:
        """The model's dims (config overridden by the explicit fields); BadInputError
        when the model is not MLA or a dim is missing."""
        if self.model is None and None in (
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.v_head_dim,
        ):
            raise BadInputError(
                "no model given: pass a config.json or model directory (--model), or all "
                "three of --qk-nope-head-dim, --qk-rope-head-dim and --v-head-dim"
            )
        parsed = isinstance(self.model, Mapping)
        return read_model(
            None if parsed else self.model,  # type: ignore[arg-type]
            config=self.model if parsed else None,  # type: ignore[arg-type]
            qk_nope_head_dim=self.qk_nope_head_dim,
            qk_rope_head_dim=self.qk_rope_head_dim,
            v_head_dim=self.v_head_dim,
            num_heads=self.num_heads,
            dtype=self.dtype,
            name=self.model_name,
        )

    def bench_argv(self) -> list[str]:
        """The ``switchboard bench`` flags for this pod (``select --measure`` runs the
        bench in a child process). A parsed config (a Mapping) cannot travel as a flag."""
        if isinstance(self.model, Mapping):
            raise BadInputError("a parsed model config cannot be passed to a bench process")
        argv: list[str] = []
        for flag, value in (
            ("--model", self.model),
            ("--cluster", self.cluster),
            ("--dtype", self.dtype),
            ("--qk-nope-head-dim", self.qk_nope_head_dim),
            ("--qk-rope-head-dim", self.qk_rope_head_dim),
            ("--v-head-dim", self.v_head_dim),
            ("--num-heads", self.num_heads),
            ("--model-name", self.model_name),
            ("--node", self.node),
            ("--pod", self.pod),
        ):
            if value is not None:
                argv += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
        if isinstance(self.engine, EngineInfo):
            version = f"=={self.engine.version}" if self.engine.version else ""
            argv += ["--engine", f"{self.engine.name}{version}"]
        elif isinstance(self.engine, str):
            argv += ["--engine", self.engine]
        return argv


@dataclass(frozen=True)
class PodDescription:
    """What the agent tells the service, and what it learnt on the way."""

    request: SelectRequest
    model: ModelDims
    device: DeviceProbe
    pretend: bool  # capability or device name given: a dry run, nothing is built


def parse_capability(value: str | Sequence[int]) -> tuple[int, int] | None:
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
    """``torch=2.11.0,flashinfer==0.7.2`` (the bare version is kept), ``any`` or ``probe``.

    Raises ValueError for anything else (``torch 2.1``, a name without a version), so
    that a typo never reaches the service as a package called ``torch 2.1`` or a
    version ``=2.11.0``.
    """
    text = spec.strip()
    if text.lower() in ("any", "probe"):
        return text.lower()  # type: ignore[return-value]
    packages: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, version = item.partition("=")
        name, version = name.strip(), version.removeprefix("=").strip()
        if not sep or not _PACKAGE_NAME.match(name) or not _PACKAGE_VERSION.match(version):
            raise ValueError(
                f"package entry {item!r} is not name=version or name==version "
                "(e.g. torch==2.11.0), and the whole value is not 'any' or 'probe'"
            )
        packages[name] = version
    if not packages:
        raise ValueError(f"no package in {spec!r} (want e.g. torch=2.11.0,flashinfer=0.7.2)")
    return packages


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "request"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def describe_pod(
    spec: PodSpec, settings: AgentSettings, notes: Notes | None = None
) -> PodDescription:
    """Probe the pod and read the model into the request the service expects.

    ``packages`` None probes them, except in a dry run, where it means ``"any"`` (the
    packages of this machine say nothing about the pretended one). Raises
    BadInputError for anything that makes the description wrong; the model is read
    before the probes (which import torch), so bad input fails fast.
    """
    notes = notes if notes is not None else Notes()
    cluster = spec.cluster or settings.cluster
    if not cluster:
        raise BadInputError(f"no cluster given (--cluster or {CLUSTER})")
    problem = cluster_name_problem(cluster)
    if problem is not None:  # in words: the schema's own error would show its pattern
        raise BadInputError(f"{'--cluster' if spec.cluster else CLUSTER}: {problem}")
    dims = spec.read_model()
    requested: Backend | None = None
    if spec.requested_backend is not None:
        try:
            requested = parse_backend(str(spec.requested_backend))
        except ValueError as exc:
            raise BadInputError(f"--requested: {exc}") from None
    engine = resolve_engine(spec.engine, notes, settings)
    given_capability = parse_capability(spec.capability) if spec.capability is not None else None
    model_dtype = dims.dtype
    if model_dtype is None:
        model_dtype = DEFAULT_DTYPE
        notes.info(f"the model config names no dtype; assuming {DEFAULT_DTYPE}")

    if spec.capability is not None:
        device = DeviceProbe(name=spec.device_name, capability=given_capability, via="given")
    else:
        device = probe_device()
        if spec.device_name is not None:
            device = DeviceProbe(name=spec.device_name, capability=device.capability, via="given")

    packages = spec.packages
    if packages is None:
        packages = "any" if spec.pretend else "probe"
    package_map: dict[str, str] | None
    if packages == "probe":
        found, problems = probe_packages()
        for problem in problems:
            notes.warn(problem)
        package_map = found
    elif packages == "any":
        package_map = None
    else:
        package_map = dict(packages)  # type: ignore[arg-type]

    try:
        request = SelectRequest(
            cluster=cluster,
            node=spec.node or settings.node,
            pod=spec.pod or settings.pod or _own_pod_name(settings) or socket.gethostname() or None,
            device=DeviceInfo(name=device.name, capability=device.capability),
            model=ModelInfo(**{f: getattr(dims, f) for f in ModelInfo.model_fields}),
            dtype=model_dtype,
            packages=package_map,
            requested_backend=requested,
            strict=spec.strict,
            engine=engine,
        )
    except ValidationError as exc:
        raise BadInputError(f"invalid pod description: {_validation_message(exc)}") from None
    return PodDescription(request=request, model=dims, device=device, pretend=spec.pretend)


def _own_pod_name(settings: AgentSettings) -> str | None:
    """The pod the token file's projected service-account token is bound to: the
    name the service will hold this pod to, where the hostname may differ (a pod on the
    host network has its node's). Read unverified, only to name itself."""
    source = settings.bearer
    return pod_name_of(source()) if isinstance(source, TokenFile) else None
