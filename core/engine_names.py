"""The serving engines by name: what a pod needs to detect one and to print its flags.

The agent detects the installed engine from package metadata, accepts ``--engine
NAME[==VERSION]`` and offers one ``--format NAME-args`` per engine that takes flags;
all three come from here, and this module reads the engines from the wire contract
(``EngineName`` in ``core/schemas.py``) and their profiles (``core/engines.py``),
so that it spells none itself. Two facts are rules rather than data for now, because
every engine so far follows them: an engine's distribution on PyPI carries its name,
and its ``--format`` is its name followed by ``-args``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from mla_switchboard.core.engines import ENGINES, SWITCHBOARD
from mla_switchboard.core.schemas import EngineName

__all__ = [
    "ARGS_FORMAT_SUFFIX",
    "ENGINE_NAMES",
    "OWN_ENGINE",
    "EngineEntry",
    "by_format",
    "detection_order",
    "engine_entries",
]

OWN_ENGINE = SWITCHBOARD.name
"""Switchboard's own ``kernels/`` wrappers: the engine of a request that names none."""

ARGS_FORMAT_SUFFIX = "-args"
"""``--format vllm-args`` prints exactly the engine args for vLLM's command line."""


@dataclass(frozen=True)
class EngineEntry:
    """One serving engine as the agent meets it.

    ``distribution`` is the installed distribution whose presence says the pod runs
    this engine and whose version is the engine's (None for our own kernels, which
    are this package). ``format`` is the ``switchboard select --format`` that prints
    its engine args (None: the engine takes no command-line flags from us).
    """

    name: str
    display: str
    distribution: str | None
    format: str | None


def _entry(name: str) -> EngineEntry:
    display = ENGINES[name][0].display
    if name == OWN_ENGINE:
        return EngineEntry(name=name, display=display, distribution=None, format=None)
    return EngineEntry(
        name=name, display=display, distribution=name, format=name + ARGS_FORMAT_SUFFIX
    )


def engine_entries() -> tuple[EngineEntry, ...]:
    """Every engine the wire contract admits, in the order ``core/engines.py`` lists
    their profiles. Raises ValueError when the two disagree: a name the contract
    admits without a profile would be refused by the service's decision."""
    admitted = get_args(EngineName)
    if set(admitted) != set(ENGINES):
        raise ValueError(
            f"engine names disagree: the wire contract admits {sorted(admitted)}, "
            f"core/engines.py profiles {sorted(ENGINES)}"
        )
    return tuple(_entry(name) for name in ENGINES)


ENGINE_NAMES: tuple[str, ...] = tuple(e.name for e in engine_entries())


def detection_order() -> tuple[EngineEntry, ...]:
    """The engines a pod may have installed, in the order the agent looks for them
    (the profiles' order: vLLM before SGLang, so a pod with both runs vLLM)."""
    return tuple(e for e in engine_entries() if e.distribution is not None)


def by_format(fmt: str) -> EngineEntry | None:
    """The engine whose command line ``--format fmt`` prints, or None (json, env)."""
    return next((e for e in engine_entries() if e.format == fmt), None)
