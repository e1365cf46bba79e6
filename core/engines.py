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

from mla_switchboard.core.schemas import SEED_RULES
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


# ---------------------------------------------------------------------- SGLang
# Read from SGLang 0.5.23's source (python/sglang/srt/):
#   arg_groups/choices.py, arg_groups/fields/exec_.py   the accepted backend names
#   arg_groups/model_override_base.py:138-152           prefill = --prefill-attention-
#        backend, else --attention-backend; decode likewise with its own flag
#   arg_groups/model_override_base.py:277-351           the generic MLA default: 9.x fa3,
#        10.x flashinfer, otherwise triton
#   arg_groups/model_overrides/deepseek_v2.py:179-188   DeepSeek-V3-family models on 10.x
#        default to trtllm_mla, but only while all three flags are unset: setting only
#        the prefill flag would move decode from trtllm_mla to flashinfer
#   layers/attention/attention_registry.py:238-247      fa3 with MLA asserts SM9x
#   models/deepseek_common/attention_backend_handler.py:159-181   fa4 and trtllm_mla
#        as MLA prefill on 10.x (trtllm_mla runs FlashInfer's trtllm ragged kernel)
#   models/deepseek_common/attention_backend_handler.py:121-123   flashinfer's ragged
#        prefill is off when qk_rope_head_dim is 0

SGLANG_ACCEPTS = frozenset({Backend.FLASH_ATTN, Backend.FLASHINFER, Backend.TRTLLM_RAGGED})


def _sglang_rule(backend: Backend, ctx: SelectionContext, label: str) -> list[str]:
    reasons: list[str] = []
    cap = ctx.capability
    if cap is None:
        return [f"{label} runs MLA prefill only on a CUDA device"]
    if ctx.dtype not in _HALF:
        reasons.append(f"{label} runs MLA prefill only in float16 or bfloat16, not {ctx.dtype}")
    if backend is Backend.FLASH_ATTN and cap.major not in (9, 10):
        reasons.append(
            f"{label} runs FLASH_ATTN MLA prefill as fa3 on 9.x or fa4 on 10.x only "
            f"(this pod: {cap})"
        )
    if backend is Backend.TRTLLM_RAGGED and cap.major != 10:
        reasons.append(f"{label} runs trtllm_mla only on compute capability 10.x (this pod: {cap})")
    if backend is Backend.FLASHINFER and ctx.dims.qk_rope_head_dim == 0:
        reasons.append(
            f"{label} turns FlashInfer's ragged MLA prefill off when qk_rope_head_dim is 0"
        )
    return reasons


def _sglang_decode(ctx: SelectionContext) -> str:
    """SGLang's own decode backend for the pod, pinned so that our prefill flag does not
    move it (see the DeepSeek-V3 override above). The request does not carry the model's
    architecture, so MLA dims (128, 64, 128) on 10.x stand for the DeepSeek-V3 family."""
    cap = ctx.capability
    if cap is not None and cap.major == 9:
        return "fa3"
    if cap is not None and cap.major == 10:
        return "trtllm_mla" if ctx.dims == R1_DIMS else "flashinfer"
    return "triton"


def _sglang_prefill_name(backend: Backend, ctx: SelectionContext) -> str:
    if backend is Backend.FLASH_ATTN:
        return "fa4" if ctx.capability is not None and ctx.capability.major == 10 else "fa3"
    return {Backend.TRTLLM_RAGGED: "trtllm_mla", Backend.FLASHINFER: "flashinfer"}[backend]


def _sglang_order(ctx: SelectionContext) -> list[Backend]:
    cap = ctx.capability
    if cap is not None and cap.major == 9:
        return [Backend.FLASH_ATTN]
    if cap is not None and cap.major == 10:
        if ctx.dims == R1_DIMS:
            return [Backend.TRTLLM_RAGGED, Backend.FLASHINFER, Backend.FLASH_ATTN]
        return [Backend.FLASHINFER, Backend.TRTLLM_RAGGED, Backend.FLASH_ATTN]
    return []  # SGLang's default there is triton, which Switchboard does not offer


def _sglang_choice(backend: Backend, ctx: SelectionContext, label: str) -> EngineChoice:
    return EngineChoice(
        args=(
            "--prefill-attention-backend",
            _sglang_prefill_name(backend, ctx),
            "--decode-attention-backend",
            _sglang_decode(ctx),
        )
    )


def _sglang_unverified_choice(backend: Backend, ctx: SelectionContext, label: str) -> EngineChoice:
    return EngineChoice(
        note=f"{label} is older than the SGLang releases whose flags were verified (0.5.x): "
        "no engine flags are given, so SGLang keeps its own choice."
    )


_SGLANG_COMMON = {
    "name": "sglang",
    "display": "SGLang",
    "accepts": SGLANG_ACCEPTS,
    "rule": _sglang_rule,
    "default_order": _sglang_order,
}

SGLANG = EngineProfile(
    since=(0, 5, 0),
    until=None,
    verified="0.5.23",
    sources=(
        "python/sglang/srt/arg_groups/model_override_base.py",
        "python/sglang/srt/arg_groups/model_overrides/deepseek_v2.py",
        "python/sglang/srt/layers/attention/attention_registry.py",
        "python/sglang/srt/models/deepseek_common/attention_backend_handler.py",
    ),
    choice=_sglang_choice,
    **_SGLANG_COMMON,  # type: ignore[arg-type]
)
SGLANG_UNVERIFIED = EngineProfile(
    since=None,
    until=(0, 5, 0),
    verified="0.4",
    sources=(),
    choice=_sglang_unverified_choice,
    **_SGLANG_COMMON,  # type: ignore[arg-type]
)


ENGINES: dict[str, tuple[EngineProfile, ...]] = {
    "switchboard": (SWITCHBOARD,),
    "vllm": (VLLM, VLLM_LEGACY),
    "sglang": (SGLANG, SGLANG_UNVERIFIED),
}
"""Every engine's profiles, newest first."""


def resolve(name: str, version: str | None) -> EngineProfile:
    """The profile for an engine and version (the newest verified one when the version
    is absent). Unknown names raise KeyError: the wire schema only admits known ones."""
    parsed = parse_version(version)
    profiles = ENGINES[name]
    for profile in profiles:
        if profile.covers(parsed):
            return profile
    return profiles[0]
