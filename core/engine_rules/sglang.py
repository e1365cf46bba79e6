"""SGLang's MLA prefill rules, per release range."""

from __future__ import annotations

from mla_switchboard.core.engine_rules.base import EngineChoice, EngineProfile
from mla_switchboard.core.specs import R1_DIMS, Backend, Dtype, SelectionContext

__all__ = ["SGLANG_PROFILES"]

_HALF = (Dtype.BFLOAT16, Dtype.FLOAT16)

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


SGLANG_PROFILES: tuple[EngineProfile, ...] = (SGLANG, SGLANG_UNVERIFIED)
"""Newest first."""
