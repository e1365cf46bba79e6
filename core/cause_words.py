"""Causes (``core/causes.py``) in words, for one reader.

``sees(cluster)`` says whether the reader may read a cluster's pods and errors (None: it
may read every cluster's). What it may not read is counted, never named: "and 3 pods in
clusters outside your scope". The words for an unrestricted reader are the sentences
the service has always written, so fleet admins and logs read what they used to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC

from mla_switchboard.core.causes import (
    ExclusionWaived,
    FailureHalt,
    FailuresBelowPolicy,
    HaltCause,
    MeasuredExclusion,
    PersonHalt,
    PodAt,
    PodError,
    SlowdownHalt,
)

Sees = Callable[[str], bool] | None
"""Whether the reader may read a cluster's pods (None: every cluster's)."""

OUTSIDE = "halted by failures in clusters outside your scope"
"""A halt as a reader sees it when none of the pods that halted it are its own."""


def halt(cause: HaltCause, sees: Sees = None) -> str:
    """Why a rollout halted, as ``sees``' reader may read it."""
    if isinstance(cause, PersonHalt):
        return f"halted by {cause.by}: {cause.note}"
    mine = _mine(cause.pods, sees)
    hidden = len(cause.pods) - len(mine)
    if cause.pods and not mine:
        return OUTSIDE
    if isinstance(cause, FailureHalt):
        return _failure_halt(cause, mine, hidden, sees)
    return _slowdown_halt(cause, mine, hidden)


def _failure_halt(cause: FailureHalt, mine: list[PodAt], hidden: int, sees: Sees) -> str:
    latest = cause.latest
    if _may(sees, latest.cluster):
        last = f"{latest.cluster}/{latest.pod} ran {cause.backend}: {latest.error}"
    else:
        last = "a pod in a cluster outside your scope"
    text = (
        f"{cause.sources} evidence source(s) ({_sources(cause)}) reported a failure of "
        f"what the rollout gave their stage pods, reaching max_failures "
        f"{cause.max_failures}: {_pods_and_clusters(mine, hidden)}; latest: {last}"
    )
    return f"{OUTSIDE} and in yours: {text}" if hidden else text


def _slowdown_halt(cause: SlowdownHalt, mine: list[PodAt], hidden: int) -> str:
    names = [f"{p.cluster}/{p.pod}" for p in mine]
    pods = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
    if hidden:
        pods += f", and {_count(hidden)} in clusters outside your scope"
    clusters = ", ".join(sorted({p.cluster for p in mine}))
    return (
        f"stage pods measured {cause.staged} at {cause.staged_tflops:.1f} TFLOP/s median "
        f"({cause.staged_samples} samples from {len(cause.pods)} pods: {pods}; "
        f"clusters {clusters}; {_sources(cause)}) "
        f"against {cause.without} at {cause.without_tflops:.1f} without the override "
        f"({cause.without_samples} samples): {cause.percent_slower:.1f} % slower "
        f"(max_slowdown_pct {cause.max_slowdown_pct:g})"
    )


def exclusion(cause: MeasuredExclusion, sees: Sees = None) -> str:
    """Why failures exclude a backend, as ``sees``' reader may read it: the pods of its
    clusters quoted (at most three), the rest counted."""
    if sees is not None:
        return _exclusion(cause, sees)
    kept = _words_kept.get(id(cause))
    if kept is not None and kept[0] is cause:
        return kept[1]
    words = _exclusion(cause, None)
    if len(_words_kept) >= WORDS_KEPT:
        _words_kept.clear()
    _words_kept[id(cause)] = (cause, words)
    return words


WORDS_KEPT = 4096
"""How many exclusions' words for every reader are kept: a decision says them, and a
fleet read makes thousands of decisions sharing one exclusion (``core/exclusions.py``
keeps it). Kept by the cause itself (its id, checked by identity)."""
_words_kept: dict[int, tuple[MeasuredExclusion, str]] = {}


def notice(cause: FailuresBelowPolicy | ExclusionWaived) -> str:
    """What failures did to a backend that stays valid. It names no pod (counts only),
    so every reader reads the same words."""
    window = _hours(cause.window_h)
    if isinstance(cause, FailuresBelowPolicy):
        return (
            f"{cause.pods} of {cause.needed} pods needed to exclude {cause.backend} for this "
            f"situation reported it failing in the last {window} h: it stays valid "
            "(SWITCHBOARD_FAILURE_MIN_PODS)"
        )
    return (
        f"failures exclude every backend otherwise valid for this pod: {cause.backend}, the "
        f"one with the fewest failing pods ({_count(cause.pods)} in the last {window} h), "
        "is kept valid rather than none"
    )


def _hours(window_h: float) -> str:
    return f"{window_h:.6g}" if window_h < 1e6 else f"{window_h:.0f}"


def _exclusion(cause: MeasuredExclusion, sees: Sees) -> str:
    quoted = [q for q in cause.quoted if _may(sees, q.cluster)]
    parts = [_quote(q) for q in quoted]
    rest = cause.pods - len(quoted)
    if rest and len(quoted) < len(cause.quoted):
        parts.append(f"and {_count(rest)} not named (some in clusters outside your scope)")
    elif rest:
        parts.append(f"and {rest} more")
    window = _hours(cause.window_h)
    return f"failed on {_count(cause.pods)} in the last {window} h (measured policy): " + "; ".join(
        parts
    )


def _quote(q: PodError) -> str:
    when = "" if q.at is None else " " + q.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    where = f"{q.cluster}/{q.pod}" if q.cluster else (q.pod or "a pod")
    return f"{where}{when}: {q.error}"


def _mine(pods: Sequence[PodAt], sees: Sees) -> list[PodAt]:
    return [p for p in pods if _may(sees, p.cluster)]


def _may(sees: Sees, cluster: str) -> bool:
    return sees is None or (cluster != "*" and sees(cluster))


def _sources(cause: FailureHalt | SlowdownHalt) -> str:
    return f"{cause.verified_pods} verified pod(s), {cause.static_sources} static source(s)"


def _pods_and_clusters(pods: list[PodAt], hidden: int) -> str:
    names = [f"{p.cluster}/{p.pod}" for p in pods]
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    clusters = ", ".join(sorted({p.cluster for p in pods}))
    outside = f" and {_count(hidden)} in clusters outside your scope" if hidden else ""
    return f"pods {shown} (clusters {clusters}){outside}"


def _count(n: int) -> str:
    return "1 pod" if n == 1 else f"{n} pods"
