"""What a token limited to some clusters may read of a row that also concerns others.

Which rows a scoped caller gets is decided where they are read (``Principal.may_see``);
this module redacts the rows it does get. A fleet-wide (``*``) override is everyone's,
but what its rollout recorded about the pods that halted it is theirs: pod and node
names and error text of clusters outside the caller's scope. Every read service
passes its rows through these functions, so the rule lives in one place; an
unrestricted caller gets every row unchanged.

What names pods and quotes errors is stored as data (``core/causes.py``: a rollout's
``halted_cause``, a candidate's ``exclusion``) and put into words here, for the caller
(``core/cause_words.py``): its clusters' pods named, the others counted. Nothing is
read back from the service's words, so nothing an agent sends (a pod name shaped like a
list of clusters, an error shaped like another cluster's pod) changes what another
caller reads. What was stored as text alone, before causes were kept, is shown whole
to unrestricted callers only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from mla_switchboard.core import cause_words as words
from mla_switchboard.core import causes
from mla_switchboard.service.identity.auth import Principal
from pydantic import TypeAdapter, ValidationError

OUTSIDE = words.OUTSIDE
"""A halt reason as a caller sees it when pods it may not see took part, or when the
reason was stored as text alone (before causes were kept as data)."""

OUTSIDE_FAILURE = "a pod in a cluster outside your scope reported a failure"
"""A ``rollout.failure`` audit note of a pod the caller may not see."""

_HALT: TypeAdapter[causes.HaltCause] = TypeAdapter(causes.HaltCause)


def etag(principal: Principal, etag: str) -> str:
    """``etag`` told apart per scope: a scoped caller's answer is another
    representation than the unrestricted one, so an If-None-Match of one never gets
    a 304 for the other."""
    if not principal.restricted:
        return etag
    scope = ",".join(principal.clusters or ())
    digest = hashlib.blake2b(scope.encode(), digest_size=6).hexdigest()
    return f'{etag[:-1]}-s{digest}"' if etag.endswith('"') else f"{etag}-s{digest}"


Sees = Callable[[str], bool] | None
"""Whether a caller may read a cluster's pods (None: an unrestricted caller)."""


def sees_of(principal: Principal) -> Sees:
    """The test the words of ``cause_words`` are rendered with for this caller."""
    return principal.may_see if principal.restricted else None


def sees_pod(principal: Principal, pod: str) -> bool:
    """Whether the caller may see ``cluster/pod`` (a rollout's ``failed_pods`` entry).
    A cluster name holds no ``/``, so what comes before the first one is the cluster."""
    cluster = pod.split("/", 1)[0]
    return cluster != "*" and principal.may_see(cluster)


def halt_cause(stored: Any) -> causes.HaltCause | None:
    """A rollout's stored ``halted_cause`` (JSON), or None when it has none or it does
    not read as one."""
    if stored is None:
        return None
    try:
        return _HALT.validate_python(stored)
    except ValidationError:
        return None


def halted(sees: Sees, reason: str | None, stored_cause: Any) -> tuple[str | None, Any]:
    """A halted rollout's ``halted_reason`` and ``halted_cause`` for a caller: words
    rendered from the cause for its scope, and the cause cut to its clusters (the pods
    of others counted in ``pods_outside_scope``). A reason stored as text alone is
    shown as stored to an unrestricted caller and as :data:`OUTSIDE` to others."""
    if sees is None:
        return reason, stored_cause
    cause = halt_cause(stored_cause)
    if cause is None:
        return (None if reason is None else OUTSIDE), None
    return words.halt(cause, sees), _cause_cut(cause, sees)


def _cause_cut(cause: causes.HaltCause, sees: Callable[[str], bool]) -> dict[str, Any]:
    if isinstance(cause, causes.PersonHalt):
        return cause.model_dump(mode="json")
    mine = [p for p in cause.pods if p.cluster != "*" and sees(p.cluster)]
    out = cause.model_dump(mode="json")
    out["pods"] = [p.model_dump(mode="json") for p in mine]
    out["pods_outside_scope"] = len(cause.pods) - len(mine)
    if isinstance(cause, causes.FailureHalt) and not sees(cause.latest.cluster):
        out["latest"] = None
    return out


def rollout(principal: Principal, shown: dict[str, Any]) -> dict[str, Any]:
    """A rollout as the API shows it (a dict), with ``failed_pods`` cut to the caller's
    clusters and ``failed_pods_outside_scope`` counting the rest, ``failure_sources``
    left out, its halt cause in the caller's words; ``failures`` stays the total (what
    the guard counted toward ``max_failures``)."""
    if not principal.restricted:
        return shown
    failed = [str(p) for p in shown.get("failed_pods") or ()]
    mine = [p for p in failed if sees_pod(principal, p)]
    out = {**shown, "failed_pods": mine, "failed_pods_outside_scope": len(failed) - len(mine)}
    reason, cause = halted(principal.may_see, shown.get("halted_reason"), shown.get("halted_cause"))
    out["halted_reason"], out["halted_cause"] = reason, cause
    # the guard's own bookkeeping names tokens, pod UIDs and other clusters' pods; what
    # it adds up to is in ``evidence``
    out.pop("failure_sources", None)
    return out


def override(principal: Principal, shown: dict[str, Any] | None) -> dict[str, Any] | None:
    """An override as the API shows it (or as an audit entry stored it)."""
    if not principal.restricted or not isinstance(shown, dict):
        return shown
    if not isinstance(shown.get("rollout"), dict):
        return shown
    return {**shown, "rollout": rollout(principal, shown["rollout"])}


def audit_entry(principal: Principal, row: dict[str, Any]) -> dict[str, Any]:
    """An override or rollout audit entry the caller may read (its cluster's or the
    fleet's): the overrides before and after redacted, and a guard's note in the
    caller's words from the entry's ``cause`` (the failing pod and its error, or the
    slowdown's halt). A guard's entry stored before causes were kept is told only as
    one about pods outside the caller's scope."""
    if not principal.restricted:
        return row
    out = {**row, "before": override(principal, row.get("before"))}
    out["after"] = override(principal, row.get("after"))
    action = row.get("action")
    if action == "rollout.failure":
        failed = _pod_error(row.get("cause"))
        if failed is not None and principal.may_see(failed.cluster):
            out["note"] = f"{failed.cluster}/{failed.pod}: {failed.error}"
        else:
            out["note"], out["cause"] = OUTSIDE_FAILURE, None
    elif action == "rollout.slowdown":
        out["note"], out["cause"] = halted(principal.may_see, row.get("note"), row.get("cause"))
    return out


def _pod_error(stored: Any) -> causes.PodError | None:
    if stored is None:
        return None
    try:
        return causes.PodError.model_validate(stored)
    except ValidationError:
        return None


OUTSIDE_PODS = "pods in clusters outside your scope, not named"
"""What a scoped caller reads in place of an exclusion's pods when the exclusion was
stored as text alone (its pods cannot be told apart)."""

_MEASURED = " (measured policy): "


def legacy_exclusion(reason: str) -> str:
    """A text that may quote a measured-policy exclusion but carries no cause (one
    stored before causes were kept, or a preview's reason ``BACKEND: failed on ...``),
    for a restricted caller: what comes before the exclusion's quotes stays (the
    count, the window: the service's own words), every pod and error after it goes.
    The service writes ``... (measured policy): `` before the first quote, so cutting
    at the first such marker can never keep a quote."""
    head, marker, _ = reason.partition(_MEASURED)
    return f"{head}{marker}{OUTSIDE_PODS}" if marker else reason


def exclusion(sees: Sees, reason: str, stored_cause: Any) -> tuple[str, Any]:
    """A measured-policy exclusion (its words and its cause) as a caller may read it:
    rendered again from the cause for its scope, the cause's quotes cut to its
    clusters; one stored as text alone is redacted whole (:func:`legacy_exclusion`)."""
    if sees is None:
        return reason, stored_cause
    cause = measured_cause(stored_cause)
    if cause is None:
        return legacy_exclusion(reason), None
    mine = [q for q in cause.quoted if q.cluster != "*" and sees(q.cluster)]
    cut = cause.model_dump(mode="json")
    cut["quoted"] = [q.model_dump(mode="json") for q in mine]
    return words.exclusion(cause, sees), cut


def measured_cause(stored: Any) -> causes.MeasuredExclusion | None:
    """A stored exclusion cause (JSON), or None."""
    if stored is None:
        return None
    try:
        return causes.MeasuredExclusion.model_validate(stored)
    except ValidationError:
        return None


def decision_answer(principal: Principal, answer: dict[str, Any]) -> dict[str, Any]:
    """A stored answer (or a select answer) for this caller: each candidate excluded
    by failures of pods of clusters its cluster trusts has its reason rendered again
    from its ``exclusion`` for the caller's scope."""
    if not principal.restricted:
        return answer
    sees = principal.may_see
    out = dict(answer)
    candidates = []
    for c in answer.get("candidates") or ():
        if not isinstance(c, dict):
            continue
        candidates.append(_candidate(sees, c))
    if "candidates" in answer:
        out["candidates"] = candidates
    if any(isinstance(c, dict) and "exclusion" not in c for c in answer.get("candidates") or ()):
        # stored before causes were kept: its messages may quote either, whole
        out["messages"] = [_legacy_message(str(m)) for m in answer.get("messages") or ()]
    return out


_HALTED = " is halted ("


def _legacy_message(message: str) -> str:
    """A message of an answer stored before causes were kept, for a restricted caller:
    a halted rollout's quoted reason becomes a pointer, an exclusion loses its quotes."""
    head, marker, _ = message.partition(_HALTED)
    if marker:
        return f"{head}{marker}its reason: see the override's rollout): answered as without it."
    return legacy_exclusion(message)


def _candidate(sees: Callable[[str], bool], c: dict[str, Any]) -> dict[str, Any]:
    stored = c.get("exclusion")
    cause = measured_cause(stored)
    reasons = [str(r) for r in c.get("reasons") or ()]
    if cause is None:
        return {**c, "reasons": [legacy_exclusion(r) for r in reasons]}
    full = words.exclusion(cause)
    mine, cut = exclusion(sees, full, stored)
    return {**c, "reasons": [mine if r == full else r for r in reasons], "exclusion": cut}


def summary(principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    """``/v1/selections/summary`` (already cut to the caller's clusters): rollouts and
    exclusion reasons in the caller's words."""
    if not principal.restricted:
        return body
    sees = principal.may_see
    out = dict(body)
    out["rollouts"] = [
        {**r, "rollout": rollout(principal, r["rollout"])} for r in body.get("rollouts", ())
    ]
    kept = body.get("excluded_causes") or {}
    excluded: dict[str, dict[str, str]] = {}
    cut: dict[str, dict[str, Any]] = {}
    for cluster, reasons in (body.get("excluded") or {}).items():
        for backend, why in reasons.items():
            stored = (kept.get(cluster) or {}).get(backend)
            text, cause = exclusion(sees, why, stored)
            excluded.setdefault(cluster, {})[backend] = text
            cut.setdefault(cluster, {})[backend] = cause
    out["excluded"], out["excluded_causes"] = excluded, cut
    return out


def preview(principal: Principal, shown: dict[str, Any]) -> dict[str, Any]:
    """A preview (a dict) for this caller: each change's reasons that quote an
    exclusion in its words, from the reason's ``exclusions``; any other text through
    :func:`texts` (it carries no cause)."""
    if not principal.restricted:
        return shown
    out = texts(principal, {k: v for k, v in shown.items() if k != "changes"})
    out["changes"] = [
        {**texts(principal, {k: v for k, v in c.items() if k != "reasons"}),
         "reasons": [_change_reason(principal.may_see, r) for r in c.get("reasons") or ()]}
        for c in shown.get("changes") or ()
    ]  # fmt: skip
    return out


def _change_reason(sees: Callable[[str], bool], reason: dict[str, Any]) -> dict[str, Any]:
    stored = reason.get("exclusions") or {}
    mine: dict[str, str] = {}
    cut: dict[str, Any] = {}
    for backend, raw in stored.items():
        cause = measured_cause(raw)
        if cause is None:
            continue
        full = f"{backend}: {words.exclusion(cause)}"
        text, cut[backend] = exclusion(sees, words.exclusion(cause), raw)
        mine[full] = f"{backend}: {text}"
    why = [mine.get(w) or legacy_exclusion(str(w)) for w in reason.get("why") or ()]
    return {**reason, "why": why, "exclusions": cut}


def texts(principal: Principal, value: Any) -> Any:
    """Every text in ``value`` (JSON-shaped: a preview) as a restricted caller may read
    it: a measured-policy exclusion's pods redacted (:func:`legacy_exclusion`). A
    preview quotes no halt reason, only exclusions."""
    if not principal.restricted:
        return value
    if isinstance(value, str):
        return legacy_exclusion(value)
    if isinstance(value, list):
        return [texts(principal, v) for v in value]
    if isinstance(value, dict):
        return {k: texts(principal, v) for k, v in value.items()}
    return value
