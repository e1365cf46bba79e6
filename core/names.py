"""Names and patterns that cross the service's edge, checked by one set of rules.

A token's cluster globs are written by two doors, ``POST /v1/tokens`` and
``switchboard token create``; both call :func:`validate_cluster_globs`, so a glob the
API would refuse with 422 can never be stored through the command line (and the other
way round). A cluster name (``select --cluster``, ``$SWITCHBOARD_CLUSTER``) is checked
by :func:`cluster_name_problem`, and both say what is wrong in the words of
:func:`cluster_rule`, so a person never has to read a regular expression, and the
command line, the schema's description and the token commands cannot word the rule
differently. Standard library only: the agent and the service both import ``core``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

CLUSTER_GLOB_RE = re.compile(r"^[a-z0-9*?._-]{1,63}$")
"""Lower-case cluster names (as Kubernetes writes them) with ``*`` and ``?`` wildcards."""

_MEANINGFUL = re.compile(r"[a-z0-9*]")

CLUSTER_NAME_RE = re.compile(r"^[a-z0-9._-]{1,63}$")
"""A cluster name: the glob grammar without wildcards (core/schemas.py's
``CLUSTER_PATTERN`` says the same, with the letter-or-digit rule, for JSON Schema)."""
_HAS_LETTER_OR_DIGIT = re.compile(r"[a-z0-9]")


def cluster_rule(*, wildcards: bool = False) -> str:
    """The rule for a cluster name (``wildcards``: a cluster glob) in words, as every
    message and help text states it."""
    chars = "1-63 characters of a-z, 0-9, '.', '_' and '-'"
    if wildcards:
        return (
            f"{chars}, and the wildcards '*' and '?' (lower case, as Kubernetes writes "
            "names), at least one of them a letter, a digit or '*'"
        )
    return (
        f"{chars} (lower case, as Kubernetes writes names), at least one of them a letter "
        "or a digit"
    )


def cluster_name_ok(name: str) -> bool:
    """Whether ``name`` is a cluster name (:func:`cluster_name_problem` is None)."""
    return bool(CLUSTER_NAME_RE.fullmatch(name) and _HAS_LETTER_OR_DIGIT.search(name))


def cluster_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a cluster name, in words, or None when it is one."""
    if cluster_name_ok(name):
        return None
    hint = f" (did you mean {name.lower()!r}?)" if cluster_name_ok(name.lower()) else ""
    return f"{name!r} is not a cluster name: use {cluster_rule()}{hint}"


def validate_cluster_globs(globs: list[str]) -> list[str]:
    """Return ``globs`` unchanged if every pattern is acceptable, else raise ValueError.

    An empty list is refused: "limited to no cluster" is never what an operator means
    (leave the limit out for an unlimited token). Each pattern must match
    ``^[a-z0-9*?._-]{1,63}$`` and hold a letter, digit or ``*`` (``"-"`` or ``"?."``
    match nothing useful). The message names the offending pattern and the rule, in
    the words of :func:`cluster_rule`.
    """
    if not globs:
        raise ValueError("clusters: give at least one cluster glob, or leave clusters out")
    for glob in globs:
        if (
            not isinstance(glob, str)
            or not CLUSTER_GLOB_RE.fullmatch(glob)
            or not _MEANINGFUL.search(glob)
        ):
            raise ValueError(
                f"clusters: {glob!r} is not a cluster glob: use {cluster_rule(wildcards=True)}"
            )
    return globs


def cluster_matches(cluster: str, globs: Iterable[str] | None) -> bool:
    """Whether ``cluster`` is matched by any of ``globs`` (None: every cluster).

    The one reading of the glob grammar above (``*`` any run of characters, ``?`` one
    character, case-sensitive as Kubernetes names are): token scopes, pod filters,
    rollout guards and evidence trust all ask this, so a glob cannot mean one set of
    clusters to a read and another to a write.
    """
    if globs is None:
        return True
    return any(fnmatch.fnmatchcase(cluster, glob) for glob in globs)


def model_matches(model: str | None, glob: str | None) -> bool:
    """Whether a model name is matched by an override's or a rollout's model glob (None:
    every model). A request naming no model is matched as the empty name, so only a
    glob such as ``*`` takes it; case-sensitive, as model names are written."""
    if glob is None:
        return True
    return fnmatch.fnmatchcase(model or "", glob)
