"""Switchboard's own ``kernels/`` wrappers as an engine: the spec table is the whole rule."""

from __future__ import annotations

from mla_switchboard.core.engine_rules.base import EngineChoice, EngineProfile
from mla_switchboard.core.schemas import SEED_RULES
from mla_switchboard.core.specs import Backend, SelectionContext

__all__ = ["SWITCHBOARD"]


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
