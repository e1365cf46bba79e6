"""Which serving engine will run the decision: the one place the agent decides it.

The service answers with the exact arguments that select a backend in *that* engine
(``engine_args``), and refuses backends the engine would reject at boot, so the
agent must say which engine it is. In order: the engine given (``--engine``, else
``$SWITCHBOARD_ENGINE``), else the one installed here, read from the distributions'
metadata (never imported: importing vLLM takes seconds and initialises CUDA) in the
registry's detection order, else none: the pod runs Switchboard's own kernels, what a
request without ``engine`` means. An ``--format NAME-args`` output is a promise to
put the flags on that engine's command line, so it names the engine when nothing
else does, and contradicting it is bad input.

The engines, their distributions and format names come from
``mla_switchboard.core.engine_names``; this module spells none of them.
"""

from __future__ import annotations

import importlib.metadata
import re

from mla_switchboard.agent.errors import BadInputError
from mla_switchboard.agent.notes import Notes
from mla_switchboard.agent.settings import ENGINE, AgentSettings
from mla_switchboard.core.engine_names import (
    ENGINE_NAMES,
    ENGINE_REGISTRY,
    by_format,
    detection_order,
)
from mla_switchboard.core.engines import (
    ENGINE_VERSION_MAX_LENGTH,
    ENGINE_VERSION_TEXT,
    parse_version,
    version_text,
)
from mla_switchboard.core.schemas import EngineInfo

__all__ = [
    "ENGINE_NAMES",
    "detect_engine",
    "given_engine",
    "parse_engine",
    "resolve_engine",
]

_WIRE_VERSION = re.compile(ENGINE_VERSION_TEXT)


def _wire_version(raw: str) -> str | None:
    """``raw`` in the form the contract accepts: as is, else without the local part
    (``+cu130...``), else its release numbers; None when it has none.

    Development builds carry long local versions; the engine's rules depend on the
    release, so dropping the rest loses nothing the service reads.
    """
    text = raw.strip()
    for candidate in (text, text.split("+", 1)[0]):
        if len(candidate) <= ENGINE_VERSION_MAX_LENGTH and _WIRE_VERSION.match(candidate):
            return candidate
    release = parse_version(text)  # the numbers the profiles are chosen by
    return version_text(release) if release is not None else None


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _engine(name: str, version: str | None = None) -> EngineInfo:
    return EngineInfo(name=name, version=version)  # type: ignore[arg-type]


def detect_engine() -> EngineInfo | None:
    """The serving engine installed here (the first found in detection order), or None.

    None means no engine package is installed: the pod runs Switchboard's kernels,
    which is what the service assumes for a request without ``engine``.
    """
    for entry in detection_order():
        assert entry.distribution is not None
        raw = _installed_version(entry.distribution)
        if raw is not None:
            return _engine(entry.name, _wire_version(raw))
    return None


def parse_engine(text: str) -> EngineInfo:
    """``NAME==VERSION``, ``NAME=VERSION``, a bare engine name (its version read from
    the installed package, when there is one) or our own engine, which has no version.

    Raises ValueError naming what is accepted, for the CLI to report as a bad flag.
    """
    raw = text.strip()
    name, sep, version = raw.partition("=")
    name = name.strip().lower()
    version = version.lstrip("=").strip()
    entries = {e.name: e for e in ENGINE_REGISTRY}
    example = f"{detection_order()[0].name}==0.34.0"
    if name not in entries:
        raise ValueError(
            f"unknown engine {text!r}; want one of {', '.join(ENGINE_NAMES)}, "
            f"optionally with ==VERSION (e.g. {example})"
        )
    if sep and not version:
        raise ValueError(f"engine {text!r} has '=' but no version (e.g. {example})")
    distribution = entries[name].distribution
    if distribution is None:
        if version:
            raise ValueError(f"the {name} engine takes no version (it is this package)")
        return _engine(name)
    if not version:
        found = _installed_version(distribution)
        return _engine(name, None if found is None else _wire_version(found))
    wire = _wire_version(version)
    if wire is None:  # too long, or with spaces: the contract cannot carry it
        raise ValueError(f"engine version {version!r} is not a version such as 0.34.0")
    return _engine(name, wire)  # unreadable ones too: the service says what it assumes


def given_engine(
    engine: EngineInfo | str | None, settings: AgentSettings
) -> tuple[EngineInfo | None, str]:
    """The engine the caller named, and where: the argument (``--engine``), else
    ``$SWITCHBOARD_ENGINE``; (None, "") when neither names one. BadInputError names
    the source of a value that does not parse."""
    if isinstance(engine, EngineInfo):
        return engine, "--engine"
    source = "--engine"
    if engine is None:
        engine, source = settings.engine, ENGINE
    if engine is None:
        return None, ""
    try:
        return parse_engine(engine), source
    except ValueError as exc:
        raise BadInputError(f"{source}: {exc}") from None


def resolve_engine(
    engine: EngineInfo | str | None,
    notes: Notes,
    settings: AgentSettings,
    *,
    output_format: str | None = None,
) -> EngineInfo | None:
    """The engine to name in the request: the given one (argument, then
    ``$SWITCHBOARD_ENGINE``), else the installed one, else None (Switchboard's kernels,
    the service's default).

    ``output_format`` is the ``--format`` the answer will be printed in. One that
    prints an engine's flags needs the decision to be one that engine accepts: with
    no engine given or installed (an init container without it) the request names
    that engine, version unknown (the service then applies its newest rules); a
    different engine, given or installed, is a contradiction the operator must
    resolve, so BadInputError names both.
    """
    resolved, origin = given_engine(engine, settings)
    if resolved is None:
        resolved, origin = detect_engine(), "the installed engine"
        if resolved is not None:
            version = resolved.version or "of unknown version"
            notes.info(f"serving engine: {resolved.name} {version} (installed here)")
    wanted = None if output_format is None else by_format(output_format)
    if wanted is None:
        return resolved
    if resolved is None:
        notes.info(
            f"{wanted.name} is not installed here; asking for {wanted.name} of unknown "
            f"version (give --engine {wanted.name}==VERSION to be exact)"
        )
        return _engine(wanted.name)
    if resolved.name != wanted.name:
        raise BadInputError(
            f"--format {output_format} prints {wanted.name} flags, but {origin} is "
            f"{resolved.name}; give --engine {wanted.name}==VERSION or another --format"
        )
    return resolved
