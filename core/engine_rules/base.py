"""The shape of an engine profile: what an engine accepts over one version range, and how
a choice is expressed to it. The profiles themselves are data in the modules beside
this one (one per engine); ``core/engines.py`` is the registry that lists them.
Standard library only, like the rest of ``core``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from mla_switchboard.core.specs import SPECS, Backend, MLADims, SelectionContext

__all__ = [
    "ENGINE_VERSION_MAX_LENGTH",
    "ENGINE_VERSION_PATTERN",
    "ENGINE_VERSION_TEXT",
    "ChoiceFn",
    "DeliberateRefusal",
    "EngineChoice",
    "EngineFlag",
    "EngineProfile",
    "OrderFn",
    "RuleFn",
    "Version",
    "parse_version",
    "release_suffix",
    "version_text",
]

Version = tuple[int, ...]
"""(major, minor, patch), or (major, minor, patch, post) for a ``.postN`` release."""

_RELEASE_NUMBERS = r"[0-9]+(\.[0-9]+){0,3}"
ENGINE_VERSION_PATTERN = rf"^{_RELEASE_NUMBERS}([.+-]?[0-9A-Za-z.+-]{{0,40}})?$"
"""What the wire contract accepts as an engine version: release numbers, then at most
one suffix (``rc1``, ``.post5``, ``+cu128``). The profiles are chosen by the numbers at
its start, which :func:`parse_version` reads with the same grammar."""
ENGINE_VERSION_MAX_LENGTH = 64
ENGINE_VERSION_TEXT = r"^[!-~]*$"
"""What the wire contract accepts as an engine version: any printable text without
spaces (at most ``ENGINE_VERSION_MAX_LENGTH``). A version the profiles cannot read
(``main``, ``garbage``, ``""``, an epoch such as ``1!0.34.0``) is no bad input: the pod
runs some release, so it gets the newest rules, a message that the version could not
be read, and only the flags every release takes, the same as no version."""
_NUMBERS = re.compile(_RELEASE_NUMBERS)
_READABLE = re.compile(rf"{_RELEASE_NUMBERS}([.+-]?[0-9A-Za-z.+-]*)?")
_POST = re.compile(r"\.post([0-9]+)")


@functools.lru_cache(maxsize=1024)
def parse_version(text: str | None) -> Version | None:
    """``"0.33.0"``, ``"0.33.1rc1"``, ``"0.11.0+cu128"`` -> (0, 33, 0) etc.; None when
    absent or unreadable (the profile then applies its newest verified rules).
    ``"0.4.9.post5"`` -> (0, 4, 9, 5): an engine can change between post releases
    (SGLang's --prefill-attention-backend first ships in 0.4.9.post5), and the tuple
    sorts between (0, 4, 9) and (0, 4, 10). A leading ``v`` is allowed: the agent also
    reads versions that the contract would refuse (too long, a tag), for their numbers."""
    if not text:
        return None
    text = text.strip().removeprefix("v")  # a tag: PEP 440 reads v0.34.0 as 0.34.0
    if _READABLE.fullmatch(text.split("+", 1)[0]) is None:
        return None  # not release numbers and a suffix (an epoch, a branch, a word)
    m = _NUMBERS.match(text)
    if m is None:
        return None
    numbers = [int(p) for p in m.group(0).split(".")][:3]
    base = (*numbers, *([0] * (3 - len(numbers))))
    post = _POST.match(text, m.end())
    return base if post is None else (*base, int(post.group(1)))


def release_suffix(text: str) -> str:
    """What follows the release numbers (and ``.postN``) in ``text``, without a local
    part (``+cu128``, a build of the same release): ``""`` for a release itself,
    ``"rc1"`` or ``.dev3`` for a pre-release, whose code is not the release's."""
    text = text.strip().removeprefix("v").split("+", 1)[0]
    m = _NUMBERS.match(text)
    if m is None:
        return text
    parts = m.group(0).split(".")
    if len(parts) > 3:  # a fourth number (vLLM's 0.10.1.1) is a release of its own
        return text[len(".".join(parts[:3])) :]
    post = _POST.match(text, m.end())
    return text[(post or m).end() :]


def version_text(version: Version) -> str:
    post = f".post{version[3]}" if len(version) > 3 else ""
    return ".".join(str(p) for p in version[:3]) + post


@dataclass(frozen=True)
class EngineFlag:
    """How one release range is told a value: a command-line option, an environment
    variable, or both. Data per range, since a release may rename either; the choice
    an answer carries (``engine_args``, ``engine_env``) is built from it.

    ``joined``: the option and its value are one word (``--opt=VALUE``), as vLLM's
    dotted config options are written; else two (``--opt VALUE``).
    """

    option: str | None = None
    joined: bool = False
    env: str | None = None

    def args(self, value: str) -> tuple[str, ...]:
        if self.option is None:
            return ()
        return (f"{self.option}={value}",) if self.joined else (self.option, value)

    def environ(self, value: str) -> dict[str, str]:
        return {} if self.env is None else {self.env: value}

    @property
    def spelling(self) -> str:
        """The flag as docs and tables write it, e.g. ``--opt=NAME`` or ``ENV=NAME``."""
        words = [*self.args("NAME"), *(f"{k}={v}" for k, v in self.environ("NAME").items())]
        return " ".join(words)


@dataclass(frozen=True)
class DeliberateRefusal:
    """Where the core refuses a backend that an engine release would take, on purpose.

    The release accepts the choice (its flag parses, its checks pass) but the kernel it
    then runs fails at run time, or nothing has shown that it runs: the pod would not
    come up, so refusing is the right answer even though the release's table says
    "accepted". The tests that compare the core, end to end, with every committed
    release table excuse exactly the refusals one of these covers, and fail on an
    entry that excuses none (a stale exception is a rule that no longer holds).

    It covers ``backend`` for releases in ``[since, until)`` (None: open), on the
    capability ``majors`` listed (None: every one), and, when ``qk_head_dim_over`` is
    set, only for MLA dims whose qk head dim (nope + rope) is larger than it; and when
    ``head_dims_taken`` is set, only for those whose (qk, v) head dims it refuses.
    """

    backend: Backend
    since: Version | None
    until: Version | None
    reason: str
    majors: frozenset[int] | None = None
    qk_head_dim_over: int | None = None
    head_dims_taken: Callable[[tuple[int, int]], bool] | None = None
    """When set, only MLA dims whose (qk, v) head dims this refuses are covered."""

    def covers(self, backend: Backend, version: Version, ctx: SelectionContext) -> bool:
        if backend is not self.backend:
            return False
        if (self.since is not None and version < self.since) or (
            self.until is not None and version >= self.until
        ):
            return False
        cap = ctx.capability
        if self.majors is not None and (cap is None or cap.major not in self.majors):
            return False
        taken = self.head_dims_taken
        if taken is not None and taken((ctx.dims.qk_head_dim, ctx.dims.v_head_dim)):
            return False
        over = self.qk_head_dim_over
        return over is None or ctx.dims.qk_head_dim > over


@dataclass(frozen=True)
class EngineChoice:
    """How the engine is told to run one backend, and what else the answer must say."""

    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    note: str | None = None  # e.g. why there are no flags
    untold: str | None = None
    """Why the engine cannot be told this backend at all (the release has no flag for
    it, or which release runs is not known): the answer then gives no flags and the
    engine makes its own choice, so a strict request for it cannot be honoured. None:
    ``args``/``env`` tell it."""

    @property
    def told(self) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
        """What reaches the engine (its argv and environment), for comparing choices."""
        return self.args, tuple(sorted(self.env.items()))


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
    plain_attention: Mapping[MLADims, str] = field(default_factory=dict)
    """MLA dims of models the engine builds with plain attention, not MLA (the model
    family, for the answer): it reads no MLA prefill flag for them, so it refuses no
    backend and is told none."""
    releases: tuple[str, ...] = ()
    """The releases whose own tables these rules were read from (empty: rules not read
    per release, such as our own kernels' or those of releases without the flag). A
    version inside the range but not among them gets the range's rules, and is told."""

    def context(self, ctx: SelectionContext) -> SelectionContext:
        """``ctx`` with the packages the engine brings itself counted as present (a pod
        that did not report one must not be refused a backend for lacking it)."""
        if not self.bundled_packages or ctx.packages is None:
            return ctx
        bundled = {name: "bundled" for name in self.bundled_packages}
        return replace(ctx, packages={**bundled, **ctx.packages})

    def refusals(self, backend: Backend, ctx: SelectionContext, version: str | None) -> list[str]:
        """Why a pod running this engine cannot be answered ``backend`` (empty: it
        can): the spec table's reasons, what the kernel needs, then the engine's own
        (:meth:`reasons`), the packages the engine brings counted as present. What
        the evaluator and the GPU shape sweep both ask."""
        ctx = self.context(ctx)
        return SPECS[backend].validate(ctx) + self.reasons(backend, ctx, version)

    def covers(self, version: Version | None) -> bool:
        if version is None:
            return self.until is None  # unknown version: the newest profile
        return (self.since is None or version >= self.since) and (
            self.until is None or version < self.until
        )

    def label(self, version: str | None) -> str:
        """The engine and release reasons name: the pod's release when it can be read,
        else the one whose rules are assumed."""
        shown = version if parse_version(version) is not None else self.verified
        return f"{self.display} {shown}"

    def without_mla(self, ctx: SelectionContext, version: str | None) -> str | None:
        """Why no MLA prefill backend applies to this model in the engine (None: one
        does): the engine builds it with plain attention."""
        model = self.plain_attention.get(ctx.dims)
        if model is None:
            return None
        return (
            f"{self.label(version)} builds {model} (MLA dims {ctx.dims}) with plain "
            "attention, not an MLA prefill backend, so no MLA prefill flag is read: "
            "no flag needed"
        )

    def reasons(self, backend: Backend, ctx: SelectionContext, version: str | None) -> list[str]:
        """Why this engine will not run ``backend`` for ``ctx`` (empty: it will, or the
        engine uses no MLA prefill backend for this model: it refuses none then)."""
        if self.without_mla(ctx, version) is not None:
            return []
        label = self.label(version)
        if backend not in self.accepts:
            names = ", ".join(b.value for b in Backend if b in self.accepts)
            return [f"{label} has no {backend} MLA prefill backend (it accepts {names})"]
        return self.rule(backend, ctx, label)

    def notes(self, version: str | None) -> list[str]:
        """What an answer must add about the rules themselves. A release newer than the
        newest whose rules were read (``verified`` of the open-ended profile), one whose
        version cannot be read, or no version at all, gets those newest rules; a release
        inside a range that was not read itself (a patch or post release published since,
        a pre-release) gets the range's. Each is told so."""
        parsed = parse_version(version)
        newest = parse_version(self.verified)
        if version is None:
            if self.until is None and self.releases:
                return [
                    f"No {self.display} version was given: the rules of {self.display} "
                    f"{self.verified}, the newest release read, are assumed"
                ]
            return []  # an engine without releases (our own kernels) has none to give
        if self.until is None and newest is not None:
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
        if not self.releases or parsed is None or not self.covers(parsed):
            return []
        if release_suffix(version) == "" and parsed in {parse_version(r) for r in self.releases}:
            return []
        span = self.releases[0]
        if len(self.releases) > 1:
            span = f"{self.releases[0]} to {self.releases[-1]}"
        return [
            f"{self.display} {version} was not read itself: the rules read from its release "
            f"range ({span}) are assumed"
        ]
