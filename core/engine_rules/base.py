"""The shape of an engine profile: what an engine accepts over one version range, and how
a choice is expressed to it. The profiles themselves are data in the modules beside
this one (one per engine); ``core/engines.py`` is the registry that lists them.
Standard library only, like the rest of ``core``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mla_switchboard.core.specs import Backend, SelectionContext

__all__ = [
    "ChoiceFn",
    "EngineChoice",
    "EngineProfile",
    "OrderFn",
    "RuleFn",
    "Version",
    "parse_version",
    "version_text",
]

Version = tuple[int, ...]
"""(major, minor, patch), or (major, minor, patch, post) for a ``.postN`` release."""

_VERSION = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.post(\d+))?")


def parse_version(text: str | None) -> Version | None:
    """``"0.33.0"``, ``"0.33.1rc1"``, ``"0.11.0+cu128"`` -> (0, 33, 0) etc.; None when
    absent or unreadable (the profile then applies its newest verified rules).
    ``"0.4.9.post5"`` -> (0, 4, 9, 5): an engine can change between post releases
    (SGLang's --prefill-attention-backend first ships in 0.4.9.post5), and the tuple
    sorts between (0, 4, 9) and (0, 4, 10)."""
    if not text:
        return None
    m = _VERSION.match(text)
    if m is None:
        return None
    base = (int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0))
    return base if m.group(4) is None else (*base, int(m.group(4)))


def version_text(version: Version) -> str:
    post = f".post{version[3]}" if len(version) > 3 else ""
    return ".".join(str(p) for p in version[:3]) + post


@dataclass(frozen=True)
class EngineChoice:
    """How the engine is told to run one backend, and what else the answer must say."""

    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    note: str | None = None  # e.g. why there are no flags


RuleFn = Callable[[Backend, SelectionContext, str], list[str]]
OrderFn = Callable[[SelectionContext], list[Backend]]
ChoiceFn = Callable[[Backend, SelectionContext, str], EngineChoice]


@dataclass(frozen=True)
class EngineProfile:
    """One engine over one version range ``[since, until)``.

    ``rule(backend, ctx, label)`` returns the engine's reasons against a backend (empty:
    the engine runs it); ``default_order(ctx)`` is the engine's own priority list;
    ``choice(backend, ctx, label)`` the flags that select it. ``label`` is the engine
    and version as the reasons spell it ("vLLM 0.33.0").
    """

    name: str
    display: str
    since: Version | None
    until: Version | None
    verified: str  # the version whose source the rules were read from
    sources: tuple[str, ...]
    accepts: frozenset[Backend]
    rule: RuleFn
    default_order: OrderFn
    choice: ChoiceFn
    bundled_packages: frozenset[str] = frozenset()
    """Import names of the packages the engine itself depends on, so a pod running it
    always has them (SGLang installs flashinfer): a pod that did not report one must
    not be refused a backend for lacking it."""

    def covers(self, version: Version | None) -> bool:
        if version is None:
            return self.until is None  # unknown version: the newest profile
        return (self.since is None or version >= self.since) and (
            self.until is None or version < self.until
        )

    def label(self, version: str | None) -> str:
        return f"{self.display} {version or self.verified}"

    def reasons(self, backend: Backend, ctx: SelectionContext, version: str | None) -> list[str]:
        """Why this engine will not run ``backend`` for ``ctx`` (empty: it will)."""
        label = self.label(version)
        if backend not in self.accepts:
            names = ", ".join(b.value for b in Backend if b in self.accepts)
            return [f"{label} has no {backend} MLA prefill backend (it accepts {names})"]
        return self.rule(backend, ctx, label)

    def notes(self, version: str | None) -> list[str]:
        """What an answer must add about the rules themselves: a release newer than the
        newest whose rules were read (``verified`` of the open-ended profile), or one
        whose version cannot be read, gets those newest rules, and is told so."""
        if self.until is not None or not version:
            return []
        newest = parse_version(self.verified)
        parsed = parse_version(version)
        if newest is None:
            return []
        if parsed is None:
            return [
                f"{self.display} version {version!r} cannot be read: the rules of "
                f"{self.display} {self.verified}, the newest release read, are assumed"
            ]
        if parsed > newest:
            return [
                f"{self.display} {version} is newer than the newest release whose rules "
                f"were read ({self.verified}): its rules are assumed"
            ]
        return []
