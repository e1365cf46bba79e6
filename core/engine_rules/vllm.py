"""vLLM's MLA prefill rules, per release range."""

from __future__ import annotations

from mla_switchboard.core.engine_rules.base import EngineChoice, EngineProfile
from mla_switchboard.core.specs import (
    KIMI_LINEAR_DIMS,
    R1_DIMS,
    Backend,
    Dtype,
    MLADims,
    SelectionContext,
)

__all__ = ["VLLM_PROFILES"]

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


VLLM_PROFILES: tuple[EngineProfile, ...] = (VLLM, VLLM_LEGACY)
"""Newest first."""
