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

from mla_switchboard.core.engine_rules.base import (
    EngineChoice,
    EngineProfile,
    Version,
    parse_version,
    version_text,
)
from mla_switchboard.core.engine_rules.sglang import SGLANG_PROFILES
from mla_switchboard.core.engine_rules.switchboard import SWITCHBOARD
from mla_switchboard.core.engine_rules.vllm import VLLM_PROFILES

__all__ = [
    "ENGINES",
    "SWITCHBOARD",
    "EngineChoice",
    "EngineProfile",
    "Version",
    "parse_version",
    "resolve",
    "version_text",
]

ENGINES: dict[str, tuple[EngineProfile, ...]] = {
    "switchboard": (SWITCHBOARD,),
    "vllm": VLLM_PROFILES,
    "sglang": SGLANG_PROFILES,
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
