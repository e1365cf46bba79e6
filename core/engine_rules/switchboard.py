"""Switchboard's own ``kernels/`` wrappers as an engine: the spec table is the rule, less
what failed on the GPU (FlashInfer's FA2 kernel on 9.x: ``bench/results/h200/shapes.json``).

Its own default order is the seed rules' priority lists, kept here as plain data so that
the wire contract (``core/schemas.py``, which builds ``SEED_RULES`` from them) can read
the engine registry without importing itself back.
"""

from __future__ import annotations

from collections.abc import Mapping

from mla_switchboard.core.engine_rules.base import EngineChoice, EngineFlag, EngineProfile
from mla_switchboard.core.specs import FLASHINFER_FA3_HEAD_DIMS, Backend, SelectionContext

__all__ = ["SEED_DEFAULT", "SEED_PRIORITIES", "SWITCHBOARD", "SWITCHBOARD_ENV", "SWITCHBOARD_FLAG"]

SEED_DEFAULT: tuple[Backend, ...] = (Backend.FLASH_ATTN,)
SEED_PRIORITIES: Mapping[str, tuple[Backend, ...]] = {
    "10": (Backend.TRTLLM_RAGGED, Backend.FLASHINFER, Backend.CUDNN, Backend.FLASH_ATTN),
}
"""vLLM-compatible priorities by capability major: Blackwell gets the specialised
kernels, everything else ``SEED_DEFAULT`` (see shared/seed for the excerpt these
reproduce)."""

SWITCHBOARD_ENV = "SWITCHBOARD_BACKEND"
SWITCHBOARD_FLAG = EngineFlag(env=SWITCHBOARD_ENV)
"""A pod running our own kernels is told the backend in the environment, the variable
the agent's ``env`` format also exports."""


FLASHINFER_FA2_ON_HOPPER = (
    "its FA2 kernel, which FlashInfer runs on 9.x for other head dims, returned an LSE "
    "1.3e-3 off the fp32 reference for (192, 64) in bf16 (the kernels' contract allows "
    "1e-3) and stopped the process with an illegal instruction for (96, 64) on the H200 "
    "(bench/results/h200/shapes.json)"
)
"""Why our FLASHINFER wrapper is not answered on 9.x outside its FA3 head dims."""


def _switchboard_rule(backend: Backend, ctx: SelectionContext, label: str) -> list[str]:
    """Our own wrappers run what the spec table accepts, less what failed on the GPU:
    FlashInfer on 9.x beyond the head dims of its FA3 kernel (FLASH_ATTN, which pads
    them for FA3, runs those dims there)."""
    if backend is not Backend.FLASHINFER or ctx.capability is None or ctx.capability.major != 9:
        return []
    pair = (ctx.dims.qk_head_dim, ctx.dims.v_head_dim)
    if pair in FLASHINFER_FA3_HEAD_DIMS:
        return []
    taken = " or ".join(str(p) for p in sorted(FLASHINFER_FA3_HEAD_DIMS))
    return [
        f"model MLA dims {ctx.dims} not run by our FLASHINFER wrapper on 9.x: it runs "
        f"FlashInfer's FA3 kernel there, head dims (qk, v) {taken} only, not {pair}; "
        + FLASHINFER_FA2_ON_HOPPER
    ]


def _switchboard_order(ctx: SelectionContext) -> list[Backend]:
    if ctx.capability is None:
        return []
    return list(SEED_PRIORITIES.get(str(ctx.capability.major), SEED_DEFAULT))


def _switchboard_choice(backend: Backend, ctx: SelectionContext, label: str) -> EngineChoice:
    return EngineChoice(
        args=SWITCHBOARD_FLAG.args(backend.value), env=SWITCHBOARD_FLAG.environ(backend.value)
    )


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
