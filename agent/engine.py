"""Which serving engine will run the decision: detected, or given with ``--engine``.

The service answers with the exact arguments that select a backend in *that* engine
(``engine_args``), and refuses backends the engine would reject at boot, so the
agent must say which engine it is. It reads the installed distributions' metadata
(never imports them: importing vLLM takes seconds and initialises CUDA): vLLM
first, then SGLang, as issue 12 specifies; with neither installed the pod runs
Switchboard's own kernels (``switchboard``, what a request without ``engine``
means). An init container that runs the agent in an image without the engine says
so with ``--engine vllm==0.33.0``.
"""

from __future__ import annotations

import importlib.metadata
import re

from mla_switchboard.core.schemas import EngineInfo

__all__ = ["ENGINE_DISTRIBUTIONS", "ENGINE_NAMES", "detect_engine", "parse_engine"]

ENGINE_DISTRIBUTIONS: tuple[tuple[str, str], ...] = (("vllm", "vllm"), ("sglang", "sglang"))
"""(engine name, distribution name) in detection order: vLLM first, then SGLang."""
ENGINE_NAMES = ("vllm", "sglang", "switchboard")

# What the wire contract accepts as a version (core/schemas.py EngineVersion).
_WIRE_VERSION = re.compile(r"^[0-9]+(\.[0-9]+){0,3}([.+-]?[0-9A-Za-z.+-]{0,40})?$")
_RELEASE = re.compile(r"^[0-9]+(\.[0-9]+){0,3}")


def _wire_version(raw: str) -> str | None:
    """``raw`` in the form the contract accepts: as is, else without the local part
    (``+cu130...``), else its release numbers; None when it has none.

    Development builds carry long local versions; the engine's rules depend on the
    release, so dropping the rest loses nothing the service reads.
    """
    text = raw.strip()
    for candidate in (text, text.split("+", 1)[0]):
        if len(candidate) <= 64 and _WIRE_VERSION.match(candidate):
            return candidate
    match = _RELEASE.match(text)
    return match.group(0) if match else None


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def detect_engine() -> EngineInfo | None:
    """The serving engine installed here (vLLM first, then SGLang), or None.

    None means no engine package is installed: the pod runs Switchboard's kernels,
    which is what the service assumes for a request without ``engine``.
    """
    for name, distribution in ENGINE_DISTRIBUTIONS:
        raw = _installed_version(distribution)
        if raw is not None:
            return EngineInfo(name=name, version=_wire_version(raw))  # type: ignore[arg-type]
    return None


def parse_engine(text: str) -> EngineInfo:
    """``vllm==0.33.0``, ``vllm=0.33.0``, ``sglang==0.5.2``, ``switchboard`` or a bare
    engine name (its version read from the installed package, when there is one).

    Raises ValueError naming what is accepted, for the CLI to report as a bad flag.
    """
    raw = text.strip()
    name, sep, version = raw.partition("=")
    name = name.strip().lower()
    version = version.lstrip("=").strip()
    if name not in ENGINE_NAMES:
        raise ValueError(
            f"unknown engine {text!r}; want one of {', '.join(ENGINE_NAMES)}, "
            "optionally with ==VERSION (e.g. vllm==0.33.0)"
        )
    if sep and not version:
        raise ValueError(f"engine {text!r} has '=' but no version (e.g. vllm==0.33.0)")
    if name == "switchboard":
        if version:
            raise ValueError("the switchboard engine takes no version (it is this package)")
        return EngineInfo(name="switchboard")
    if not version:
        installed = dict(ENGINE_DISTRIBUTIONS)[name]
        found = _installed_version(installed)
        return EngineInfo(name=name, version=None if found is None else _wire_version(found))  # type: ignore[arg-type]
    if _wire_version(version) != version:
        raise ValueError(f"engine version {version!r} is not a version such as 0.33.0")
    return EngineInfo(name=name, version=version)  # type: ignore[arg-type]
