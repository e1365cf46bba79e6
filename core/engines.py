"""What each serving engine accepts, as data: one profile per engine and version range.

A decision is only worth what the engine can run. vLLM refuses to start with a prefill
backend it does not know (argument parsing, exit 2) or one that is invalid for the pod
(``ValueError`` at model initialisation), so every candidate is checked twice: by our
own spec (``specs.py``: can the kernel run here?) and by the engine's rule (will the
engine run it?). A profile says, for one engine and version range:

- which backend names the engine accepts and its own validity rules, each reason
  naming the engine and version ("vLLM 0.33.0 runs FLASHINFER prefill only on compute
  capability 10.x");
- its own default order (policy ``engine-default``);
- how a choice is expressed: the exact argv (``engine_args``) and environment
  (``engine_env``), so a consumer in any language needs no mapping of its own.

Every rule cites the engine's source file and the version it was read from. Like the
rest of ``core`` this module is standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mla_switchboard.core.specs import (
    KIMI_LINEAR_DIMS,
    R1_DIMS,
    Backend,
    Dtype,
    MLADims,
    SelectionContext,
)

__all__ = [
    "ENGINES",
    "SWITCHBOARD",
    "EngineChoice",
    "EngineProfile",
    "Version",
    "parse_version",
    "resolve",
]

Version = tuple[int, int, int]

_VERSION = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def parse_version(text: str | None) -> Version | None:
    """``"0.33.0"``, ``"0.33.1rc1"``, ``"0.11.0+cu128"`` -> (0, 33, 0) etc.; None when
    absent or unreadable (the profile then applies its newest verified rules)."""
    if not text:
        return None
    m = _VERSION.match(text)
    if m is None:
        return None
    return (int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0))


def _v(version: Version) -> str:
    return ".".join(str(p) for p in version)


@dataclass(frozen=True)
class EngineChoice:
    """How the engine is told to run one backend, and what else the answer must say."""

    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    note: str | None = None  # e.g. why there are no flags


RuleFn = Callable[[Backend, SelectionContext, str], list[str]]
OrderFn = Callable[[SelectionContext], list[Backend]]
ChoiceFn = Callable[[Backend, SelectionContext, str], EngineChoice]


@dataclass(frozen=True)
class EngineProfile:
    """One engine over one version range ``[since, until)``.

    ``rule(backend, ctx, label)`` returns the engine's reasons against a backend (empty:
    the engine runs it); ``default_order(ctx)`` is the engine's own priority list;
    ``choice(backend, ctx, label)`` the flags that select it. ``label`` is the engine
    and version as the reasons spell it ("vLLM 0.33.0").
    """

    name: str
    display: str
    since: Version | None
    until: Version | None
    verified: str  # the version whose source the rules were read from
    sources: tuple[str, ...]
    accepts: frozenset[Backend]
    rule: RuleFn
    default_order: OrderFn
    choice: ChoiceFn

    def covers(self, version: Version | None) -> bool:
        if version is None:
            return self.until is None  # unknown version: the newest profile
        return (self.since is None or version >= self.since) and (
            self.until is None or version < self.until
        )

    def label(self, version: str | None) -> str:
        return f"{self.display} {version or self.verified}"

    def reasons(self, backend: Backend, ctx: SelectionContext, version: str | None) -> list[str]:
        """Why this engine will not run ``backend`` for ``ctx`` (empty: it will)."""
        label = self.label(version)
        if backend not in self.accepts:
            names = ", ".join(b.value for b in Backend if b in self.accepts)
            return [f"{label} has no {backend} MLA prefill backend (it accepts {names})"]
        return self.rule(backend, ctx, label)


# ----------------------------------------------------------------- switchboard


def _switchboard_rule(backend: Backend, ctx: SelectionContext, label: str) -> list[str]:
    return []  # our own wrappers: the spec table is the whole rule


def _switchboard_order(ctx: SelectionContext) -> list[Backend]:
    from mla_switchboard.core.schemas import SEED_RULES  # the seed rules are our default

    if ctx.capability is None:
        return []
    by_cap = SEED_RULES.by_capability
    key = str(ctx.capability.major)
    return list(by_cap.get(key, SEED_RULES.default))


def _switchboard_choice(backend: Backend, ctx: SelectionContext, label: str) -> EngineChoice:
    return EngineChoice(env={"SWITCHBOARD_BACKEND": backend.value})


SWITCHBOARD = EngineProfile(
    name="switchboard",
    display="switchboard",
    since=None,
    until=None,
    verified="kernels/",
    sources=("core/specs.py",),
    accepts=frozenset(Backend),
    rule=_switchboard_rule,
    default_order=_switchboard_order,
    choice=_switchboard_choice,
)


# ------------------------------------------------------------------------ vLLM
# Read from vLLM 0.33.0's source:
#   vllm/config/attention.py            AttentionConfig.mla_prefill_backend (the flag)
#   vllm/v1/attention/backends/mla/prefill/registry.py   the accepted names
#   vllm/v1/attention/backends/mla/prefill/base.py       dtype rule (fp16/bf16)
#   vllm/v1/attention/backends/mla/prefill/{flash_attn,flashinfer,trtllm_ragged,
#                                         tokenspeed_mla}.py   per-backend rules
#   vllm/v1/attention/backends/mla/prefill/selector.py   an invalid explicit choice
#                                                        raises ValueError at init
#   vllm/platforms/interface.py  get_mla_prefill_backend_cls: the default order

VLLM_FLAG = "--attention-config.mla_prefill_backend"
VLLM_ACCEPTS = frozenset(
    {Backend.FLASH_ATTN, Backend.FLASHINFER, Backend.TRTLLM_RAGGED, Backend.TOKENSPEED_MLA}
)
VLLM_FA_DIMS = frozenset({R1_DIMS, KIMI_LINEAR_DIMS, MLADims(64, 64, 128), MLADims(256, 0, 256)})
_VLLM_BLACKWELL_DIMS: dict[Backend, frozenset[MLADims]] = {
    Backend.FLASHINFER: frozenset({R1_DIMS}),
    Backend.TRTLLM_RAGGED: frozenset({R1_DIMS, KIMI_LINEAR_DIMS}),
    Backend.TOKENSPEED_MLA: frozenset({R1_DIMS}),
}
_HALF = (Dtype.BFLOAT16, Dtype.FLOAT16)


def _dims_text(allowed: frozenset[MLADims]) -> str:
    return " or ".join(sorted(str(d) for d in allowed))


def _vllm_rule(backend: Backend, ctx: SelectionContext, label: str) -> list[str]:
    reasons: list[str] = []
    if ctx.capability is None:
        reasons.append(f"{label} runs MLA prefill only on a CUDA device")
    if ctx.dtype not in _HALF:
        reasons.append(f"{label} runs MLA prefill only in float16 or bfloat16, not {ctx.dtype}")
    if backend is Backend.FLASH_ATTN:
        if ctx.dims not in VLLM_FA_DIMS:
            reasons.append(
                f"{label} runs FLASH_ATTN prefill only for MLA dims {_dims_text(VLLM_FA_DIMS)}, "
                f"not {ctx.dims}"
            )
        return reasons
    if ctx.capability is not None and ctx.capability.major != 10:
        reasons.append(
            f"{label} runs {backend} prefill only on compute capability 10.x "
            f"(this pod: {ctx.capability})"
        )
    allowed = _VLLM_BLACKWELL_DIMS[backend]
    if ctx.dims not in allowed:
        reasons.append(
            f"{label} runs {backend} prefill only for MLA dims {_dims_text(allowed)}, "
            f"not {ctx.dims}"
        )
    return reasons


def _vllm_order(ctx: SelectionContext) -> list[Backend]:
    if ctx.capability is not None and ctx.capability.major == 10:
        if ctx.dims == KIMI_LINEAR_DIMS:
            return [Backend.TRTLLM_RAGGED, Backend.FLASH_ATTN, Backend.FLASHINFER,
                    Backend.TOKENSPEED_MLA]  # fmt: skip
        return [Backend.FLASH_ATTN, Backend.TRTLLM_RAGGED, Backend.FLASHINFER,
                Backend.TOKENSPEED_MLA]  # fmt: skip
    return [Backend.FLASH_ATTN]


def _vllm_choice(backend: Backend, ctx: SelectionContext, label: str) -> EngineChoice:
    return EngineChoice(args=(f"{VLLM_FLAG}={backend.value}",))


def _vllm_legacy_choice(backend: Backend, ctx: SelectionContext, label: str) -> EngineChoice:
    return EngineChoice(
        note=f"{label} has no {VLLM_FLAG} (added in vLLM 0.21): no engine flags are given, "
        "so vLLM keeps its own choice. Upgrade vLLM to direct its MLA prefill backend."
    )


_VLLM_COMMON = {
    "name": "vllm",
    "display": "vLLM",
    "accepts": VLLM_ACCEPTS,
    "rule": _vllm_rule,
    "default_order": _vllm_order,
}

VLLM = EngineProfile(
    since=(0, 21, 0),
    until=None,
    verified="0.33.0",
    sources=(
        "vllm/config/attention.py",
        "vllm/v1/attention/backends/mla/prefill/registry.py",
        "vllm/v1/attention/backends/mla/prefill/base.py",
        "vllm/v1/attention/backends/mla/prefill/selector.py",
        "vllm/platforms/interface.py",
    ),
    choice=_vllm_choice,
    **_VLLM_COMMON,  # type: ignore[arg-type]
)
VLLM_LEGACY = EngineProfile(
    since=None,
    until=(0, 21, 0),
    verified="0.20.0",
    sources=("vllm/config/attention.py (use_cudnn_prefill, use_trtllm_ragged_deepseek_prefill)",),
    choice=_vllm_legacy_choice,
    **_VLLM_COMMON,  # type: ignore[arg-type]
)


ENGINES: dict[str, tuple[EngineProfile, ...]] = {
    "switchboard": (SWITCHBOARD,),
    "vllm": (VLLM, VLLM_LEGACY),
}
"""Every engine's profiles, newest first. ``sglang`` is added by ``sglang.py``."""


def resolve(name: str, version: str | None) -> EngineProfile:
    """The profile for an engine and version (the newest verified one when the version
    is absent). Unknown names raise KeyError: the wire schema only admits known ones."""
    parsed = parse_version(version)
    profiles = ENGINES[name]
    for profile in profiles:
        if profile.covers(parsed):
            return profile
    return profiles[0]
