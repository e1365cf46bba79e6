"""What a token limited to some clusters may read of a row that also concerns others.

Which rows a scoped caller gets is decided where they are read (``Principal.may_see``);
this module redacts the rows it does get. A fleet-wide (``*``) override is everyone's,
but what its rollout recorded about the pods that halted it is theirs: pod and node
names and error text of clusters outside the caller's scope. Every read service
passes its rows through these functions, so the rule lives in one place; an
unrestricted caller gets every row unchanged.

The texts redacted here are the service's own (``rollouts.py`` writes the halt reasons,
``core/evaluator.py`` quotes them in decisions): a reason is kept when every cluster it
names is in scope, and replaced by :data:`OUTSIDE` otherwise, or when it names none it
can be read for (never shown by guessing).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from mla_switchboard.service.auth import Principal

OUTSIDE = "halted by failures in clusters outside your scope"
"""A halt reason as a caller sees it when pods it may not see took part."""

OUTSIDE_FAILURE = "a pod in a cluster outside your scope reported a failure"
"""A ``rollout.failure`` audit note of a pod the caller may not see."""

_CLUSTERS = re.compile(r"[(;] ?clusters ([^)]*)\)")
_HALTED = re.compile(r"^(The rollout of .* is halted \()(.*)(\): answered as without it\.)$")


def etag(principal: Principal, etag: str) -> str:
    """``etag`` told apart per scope: a scoped caller's answer is another
    representation than the unrestricted one, so an If-None-Match of one never gets
    a 304 for the other."""
    if not principal.restricted:
        return etag
    scope = ",".join(principal.clusters or ())
    digest = hashlib.blake2b(scope.encode(), digest_size=6).hexdigest()
    return f'{etag[:-1]}-s{digest}"' if etag.endswith('"') else f"{etag}-s{digest}"


def sees_pod(principal: Principal, where: str) -> bool:
    """Whether the caller may see ``cluster/pod`` (a rollout's ``failed_pods`` entry)."""
    cluster = where.split("/", 1)[0]
    return cluster != "*" and principal.may_see(cluster)


def halt_reason(principal: Principal, reason: str | None) -> str | None:
    """A rollout's ``halted_reason`` for this caller. A person's halt (``halted by
    NAME: note``, the note written for everyone the override covers) is kept; a guard's
    is kept only when every cluster it names is in scope."""
    if reason is None or not principal.restricted or reason.startswith("halted by "):
        return reason
    found = _CLUSTERS.findall(reason)
    if not found:
        return OUTSIDE
    named = {c.strip() for group in found for c in group.split(",") if c.strip()}
    return reason if all(principal.may_see(c) for c in named) else OUTSIDE


def rollout(principal: Principal, shown: dict[str, Any]) -> dict[str, Any]:
    """A rollout as the API shows it (a dict), with ``failed_pods`` cut to the caller's
    clusters and ``failed_pods_outside_scope`` counting the rest; ``failures`` stays
    the total (what the guard counted toward ``max_failures``)."""
    if not principal.restricted:
        return shown
    failed = [str(p) for p in shown.get("failed_pods") or ()]
    mine = [p for p in failed if sees_pod(principal, p)]
    out = {**shown, "failed_pods": mine, "failed_pods_outside_scope": len(failed) - len(mine)}
    out["halted_reason"] = halt_reason(principal, shown.get("halted_reason"))
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
    fleet's): the overrides before and after redacted, and a guard's note (the failing
    pod and its error, or the slowdown's pods) when it names another cluster."""
    if not principal.restricted:
        return row
    out = {**row, "before": override(principal, row.get("before"))}
    out["after"] = override(principal, row.get("after"))
    note = row.get("note")
    if isinstance(note, str):
        if row.get("action") == "rollout.failure":
            where = note.split(":", 1)[0]
            out["note"] = note if sees_pod(principal, where) else OUTSIDE_FAILURE
        elif row.get("action") == "rollout.slowdown":
            out["note"] = halt_reason(principal, note)
    return out


def decision_answer(principal: Principal, answer: dict[str, Any]) -> dict[str, Any]:
    """A stored answer of one of the caller's clusters: the messages quoting a halted
    rollout's reason (a fleet rollout halted by other clusters' pods) redacted."""
    messages = answer.get("messages")
    if not principal.restricted or not isinstance(messages, list):
        return answer
    return {**answer, "messages": [_message(principal, m) for m in messages]}


def _message(principal: Principal, message: Any) -> Any:
    if not isinstance(message, str):
        return message
    m = _HALTED.match(message)
    if m is None:
        return message
    return f"{m.group(1)}{halt_reason(principal, m.group(2))}{m.group(3)}"
