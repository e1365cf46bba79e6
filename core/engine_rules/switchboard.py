"""Switchboard's own ``kernels/`` wrappers as an engine: the spec table is the whole rule.

Its own default order is the seed rules' priority lists, kept here as plain data so that
the wire contract (``core/schemas.py``, which builds ``SEED_RULES`` from them) can read
the engine registry without importing itself back.
"""

from __future__ import annotations

from collections.abc import Mapping

from mla_switchboard.core.engine_rules.base import EngineChoice, EngineFlag, EngineProfile
from mla_switchboard.core.specs import Backend, SelectionContext

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


def _switchboard_rule(backend: Backend, ctx: SelectionContext, label: str) -> list[str]:
    return []  # our own wrappers: the spec table is the whole rule


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
