"""The serving engines as the agent meets them: detection, ``--engine`` and ``--format``.

The agent detects the installed engine from package metadata, accepts ``--engine
NAME[==VERSION]`` and offers one ``--format NAME-args`` per engine that takes flags;
all three are views of the engine registry (``core/engines.py``, whose ``Engine`` they
return), so that this module spells none itself.
"""

from __future__ import annotations

from mla_switchboard.core.engines import ENGINE_NAMES, ENGINE_REGISTRY, OWN_ENGINE, Engine

__all__ = [
    "ENGINE_NAMES",
    "ENGINE_REGISTRY",
    "OWN_ENGINE",
    "Engine",
    "by_format",
    "detection_order",
]


def detection_order() -> tuple[Engine, ...]:
    """The engines a pod may have installed, in the order the agent looks for them
    (the registry's order: vLLM before SGLang, so a pod with both runs vLLM)."""
    return tuple(e for e in ENGINE_REGISTRY if e.distribution is not None)


def by_format(fmt: str) -> Engine | None:
    """The engine whose command line ``--format fmt`` prints, or None (json, env)."""
    return next((e for e in ENGINE_REGISTRY if e.format == fmt), None)
