"""Names and patterns that cross the service's edge, checked by one set of rules.

A token's cluster globs are written by two doors, ``POST /v1/tokens`` and
``switchboard token create``; both call :func:`validate_cluster_globs`, so a glob the
API would refuse with 422 can never be stored through the command line (and the other
way round). Standard library only: the agent and the service both import ``core``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

CLUSTER_GLOB_RE = re.compile(r"^[a-z0-9*?._-]{1,63}$")
"""Lower-case cluster names (as Kubernetes writes them) with ``*`` and ``?`` wildcards."""

_MEANINGFUL = re.compile(r"[a-z0-9*]")


def validate_cluster_globs(globs: list[str]) -> list[str]:
    """Return ``globs`` unchanged if every pattern is acceptable, else raise ValueError.

    An empty list is refused: "limited to no cluster" is never what an operator means
    (leave the limit out for an unlimited token). Each pattern must match
    ``^[a-z0-9*?._-]{1,63}$`` and hold a letter, digit or ``*`` (``"-"`` or ``"?."``
    match nothing useful). The message names the offending pattern and the rule.
    """
    if not globs:
        raise ValueError("clusters: give at least one cluster glob, or leave clusters out")
    for glob in globs:
        if not isinstance(glob, str) or not CLUSTER_GLOB_RE.fullmatch(glob):
            raise ValueError(
                f"clusters: {glob!r} is not a cluster glob: use 1-63 characters of "
                "a-z, 0-9, '.', '_', '-' and the wildcards '*' and '?'"
            )
        if not _MEANINGFUL.search(glob):
            raise ValueError(
                f"clusters: {glob!r} is not a cluster glob: it needs a letter, a digit or '*'"
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
