"""The engine registry: every serving engine, what identifies it, and its profiles.

A decision is only worth what the engine can run. vLLM refuses to start with a prefill
backend it does not know (argument parsing, exit 2) or one that is invalid for the pod
(``ValueError`` at model initialisation), so every candidate is checked twice: by our
own spec (``specs.py``: can the kernel run here?) and by the engine's rule (will the
engine run it?). A profile says, for one engine and version range:

- which backend names the engine accepts and its own validity rules, each reason
  naming the engine and version ("vLLM 0.33.0 runs FLASHINFER prefill only on compute
  capability 10.x");
- its own default order (policy ``engine-default``);
- how a choice is expressed (``EngineFlag`` per range): the exact argv
  (``engine_args``) and environment (``engine_env``), so a consumer in any language
  needs no mapping of its own.

This module is the only place an engine's identity is written outside its own profile
module (which names the profiles it holds, checked here to agree): the distribution
whose metadata says a pod runs it, the ``--format`` that prints its flags, and the
version grammar (``ENGINE_VERSION_PATTERN``); the wire contract's ``EngineName`` in
``core/schemas.py`` is built from ``ENGINE_NAMES``. The agent's detection and
``--format`` choices (``core/engine_names.py``) are derived from it; adding an engine
is a profile module and a row here. It and the profiles are standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from mla_switchboard.core.engine_rules.base import (
    ENGINE_VERSION_MAX_LENGTH,
    ENGINE_VERSION_PATTERN,
    ENGINE_VERSION_TEXT,
    EngineChoice,
    EngineFlag,
    EngineProfile,
    Version,
    parse_version,
    version_text,
)
from mla_switchboard.core.engine_rules.sglang import SGLANG_PROFILES
from mla_switchboard.core.engine_rules.switchboard import SWITCHBOARD
from mla_switchboard.core.engine_rules.vllm import VLLM_PROFILES
from mla_switchboard.core.specs import Backend, SelectionContext

__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "ENGINE_REGISTRY",
    "ENGINE_VERSION_MAX_LENGTH",
    "ENGINE_VERSION_PATTERN",
    "ENGINE_VERSION_TEXT",
    "OWN_ENGINE",
    "SWITCHBOARD",
    "Engine",
    "EngineChoice",
    "EngineFlag",
    "EngineProfile",
    "Version",
    "choose",
    "parse_version",
    "resolve",
    "version_text",
]


@dataclass(frozen=True)
class Engine:
    """One serving engine.

    ``profiles``: its rules per release range, newest first (the name and display
    name are theirs). ``distribution``: the installed distribution whose presence says
    a pod runs it and whose version is the engine's (None for our own kernels, which
    are this package). ``format``: the ``switchboard select --format`` that prints its
    engine args (None: it takes no command-line flags from us).
    """

    profiles: tuple[EngineProfile, ...]
    distribution: str | None
    format: str | None

    @property
    def name(self) -> str:
        return self.profiles[0].name

    @property
    def display(self) -> str:
        return self.profiles[0].display


ENGINE_REGISTRY: tuple[Engine, ...] = (
    Engine((SWITCHBOARD,), distribution=None, format=None),
    Engine(VLLM_PROFILES, distribution="vllm", format="vllm-args"),
    Engine(SGLANG_PROFILES, distribution="sglang", format="sglang-args"),
)
"""Every engine, in the order the agent looks for them on a pod (vLLM before SGLang,
so a pod with both runs vLLM; our own kernels are what a pod with neither runs)."""

ENGINES: dict[str, tuple[EngineProfile, ...]] = {e.name: e.profiles for e in ENGINE_REGISTRY}
"""Every engine's profiles, newest first."""

ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)
"""The engine names the wire contract admits."""

OWN_ENGINE = SWITCHBOARD.name
"""Switchboard's own ``kernels/`` wrappers: the engine of a request that names none."""


def _check(registry: tuple[Engine, ...]) -> None:
    """One name per engine, every profile of an engine under its name."""
    for engine in registry:
        names = {p.name for p in engine.profiles}
        if names != {engine.name}:
            raise ValueError(f"engine {engine.name}: its profiles are named {sorted(names)}")
    if len({e.name for e in registry}) != len(registry):
        raise ValueError("two engines share a name")


_check(ENGINE_REGISTRY)


def resolve(name: str, version: str | None) -> EngineProfile:
    """The profile for an engine and version (the newest verified one when the version
    is absent). Unknown names raise KeyError: the wire schema only admits known ones."""
    parsed = parse_version(version)
    profiles = ENGINES[name]
    for profile in profiles:
        if profile.covers(parsed):
            return profile
    return profiles[0]


def choose(
    profile: EngineProfile, version: str | None, backend: Backend, ctx: SelectionContext
) -> EngineChoice:
    """How the pod's engine is told ``backend``: ``profile``'s flags for the release.

    Without a readable version the pod may run any release of the engine, so the
    newest release's flags could stop an older one (vLLM 0.20.2's parser refuses
    ``--attention-config.mla_prefill_backend``; SGLang before 0.4.9.post5 has no
    ``--prefill-attention-backend``). Then a flag is given only where every profile of
    the engine, legacy ones included, runs ``backend`` here and tells it the very same
    argv and environment; otherwise none, the engine keeps its own choice, and the
    answer says why (``untold``: a strict request cannot be honoured). The rules the
    answer rests on stay the newest release's, which the profile's notes say.

    A model the engine builds with plain attention (vLLM's MiniCPM3) reads no MLA
    prefill flag at all: no flag, and the answer says so (``untold``).
    """
    plain = profile.without_mla(ctx, version)
    if plain is not None:
        return EngineChoice(note=f"No engine flags are given: {plain}.", untold=plain)
    chosen = profile.choice(backend, ctx, profile.label(version))
    profiles = ENGINES[profile.name]
    if parse_version(version) is not None or len(profiles) == 1:
        return chosen
    for other in profiles:
        why = _differs(other, backend, ctx, chosen)
        if why is not None:
            return _untold(profile, version, backend, why)
    return chosen


def _differs(
    other: EngineProfile, backend: Backend, ctx: SelectionContext, chosen: EngineChoice
) -> str | None:
    """Why the releases of ``other`` would not start with ``chosen`` for ``backend``
    (None: they would)."""
    label = other.label(None)
    told = other.choice(backend, ctx, label)
    if told.untold is not None:
        return told.untold
    if other.reasons(backend, other.context(ctx), None):
        return f"{label} does not run {backend} here"
    if told.told != chosen.told:
        return f"{label} is told it otherwise ({' '.join(told.args)})"
    return None


def _untold(
    profile: EngineProfile, version: str | None, backend: Backend, why: str
) -> EngineChoice:
    """No flag for ``backend`` that every release of the engine takes, and why."""
    display = profile.display
    unknown = (
        f"no {display} version was given"
        if version is None
        else f"the {display} version {version!r} cannot be read"
    )
    untold = f"{unknown}, and not every {display} release takes one flag for {backend}: {why}"
    return EngineChoice(
        note=f"No engine flags are given: {untold}. {display} keeps its own choice; give its "
        "version to direct its MLA prefill backend.",
        untold=untold,
    )
