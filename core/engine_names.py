"""The serving engines as the agent meets them: detection, ``--engine`` and ``--format``.

The agent detects the installed engine from package metadata, accepts ``--engine
NAME[==VERSION]`` and offers one ``--format NAME-args`` per engine that takes flags;
all three come from the engine registry (``core/engines.py``), so that this module
spells none itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from mla_switchboard.core.engines import ENGINE_NAMES, ENGINE_REGISTRY, OWN_ENGINE

__all__ = [
    "ENGINE_NAMES",
    "OWN_ENGINE",
    "EngineEntry",
    "by_format",
    "detection_order",
    "engine_entries",
]


@dataclass(frozen=True)
class EngineEntry:
    """One serving engine as the agent meets it (see ``core.engines.Engine``)."""

    name: str
    display: str
    distribution: str | None
    format: str | None


def engine_entries() -> tuple[EngineEntry, ...]:
    """Every engine, in the registry's order."""
    return tuple(
        EngineEntry(name=e.name, display=e.display, distribution=e.distribution, format=e.format)
        for e in ENGINE_REGISTRY
    )


def detection_order() -> tuple[EngineEntry, ...]:
    """The engines a pod may have installed, in the order the agent looks for them
    (the registry's order: vLLM before SGLang, so a pod with both runs vLLM)."""
    return tuple(e for e in engine_entries() if e.distribution is not None)


def by_format(fmt: str) -> EngineEntry | None:
    """The engine whose command line ``--format fmt`` prints, or None (json, env)."""
    return next((e for e in engine_entries() if e.format == fmt), None)
