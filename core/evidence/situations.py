"""A situation: what decides which kernel is fastest and whether it works (device,
compute capability, MLA dims, dtype, kernel and engine versions). Evidence counts only
for its own situation, and every key function that builds one lives here, so a request,
a report and an admin's clear meet on one key."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mla_switchboard.core.engines import OWN_ENGINE
from mla_switchboard.core.schemas import EngineInfo, MeasurementReport, SelectRequest
from mla_switchboard.core.specs import KERNEL_PACKAGES as _PACKAGES
from mla_switchboard.core.specs import format_capability

KERNEL_PACKAGES: tuple[str, ...] = tuple(_PACKAGES)
"""Only the packages some backend needs or uses (``core/specs.py``) change kernel speed;
others' versions don't split the evidence."""


@dataclass(frozen=True, order=True)
class Situation:
    """One situation's key, field by field as the store keeps it (a row's columns give
    one back as they are); :meth:`of` builds one from what a pod or an admin says."""

    device: str
    capability: str  # format_capability(): "9.0"
    dims: str  # dims_key(): "128,64,128"
    dtype: str
    packages: str  # canonical JSON of the kernel packages' versions
    engine: str = OWN_ENGINE  # engine_key(): "switchboard" or "vllm 0.33.0"

    @classmethod
    def of(
        cls,
        *,
        device: str | None,
        capability: Sequence[int] | str,
        dims: Sequence[int],
        dtype: str,
        packages: Mapping[str, str],
        engine: EngineInfo | str | None,
    ) -> Situation:
        """The situation of a request, a measurement report or a failure clear: every
        part written by the one key function for it, so the three meet on one key.
        ``capability`` and ``engine`` may be given as keys already (``"9.0"``, a clear's
        ``"vllm 0.33.0"``)."""
        return cls(
            device=device or "",
            capability=capability if isinstance(capability, str) else format_capability(capability),
            dims=dims_key(*dims),
            dtype=dtype,
            packages=packages_key(packages),
            engine=engine if isinstance(engine, str) else engine_key(engine),
        )

    def __post_init__(self) -> None:
        # a situation is a key of every lookup a decision or a report makes: hash its
        # six strings once, not at each lookup
        object.__setattr__(self, "_hash", hash(_fields_of(self)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined,no-any-return]

    def __reduce__(self) -> tuple[type[Situation], tuple[str, ...]]:
        return (Situation, _fields_of(self))  # the hash of a string differs per process


def _fields_of(situation: Situation) -> tuple[str, ...]:
    """A situation's fields, in order (``dataclasses.astuple`` copies deeply: slower)."""
    s = situation
    return (s.device, s.capability, s.dims, s.dtype, s.packages, s.engine)


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
    if engine is None or engine.name == OWN_ENGINE:
        return OWN_ENGINE
    return f"{engine.name} {engine.version or '?'}"


def situation_of(request: SelectRequest) -> Situation | None:
    """None when the request cannot be matched exactly: no GPU, or packages unknown."""
    cap = request.device.capability
    if cap is None or request.packages is None:
        return None
    return situation_from(request, cap, request.packages)


def situation_from(
    source: SelectRequest | MeasurementReport, cap: Sequence[int], packages: Mapping[str, str]
) -> Situation:
    """The situation a request or a report is about (both say it in the same fields)."""
    m = source.model
    return Situation.of(
        device=source.device.name,
        capability=cap,
        dims=(m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
        dtype=source.dtype.value,
        packages=packages,
        engine=source.engine,
    )
