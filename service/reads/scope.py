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

from mla_switchboard.core.evaluator import FLEET_HALT_POINTER
from mla_switchboard.service.auth import Principal

OUTSIDE = "halted by failures in clusters outside your scope"
"""A halt reason as a caller sees it when pods it may not see took part."""

OUTSIDE_FAILURE = "a pod in a cluster outside your scope reported a failure"
"""A ``rollout.failure`` audit note of a pod the caller may not see."""

_CLUSTERS = re.compile(r"[(;] ?clusters ([^)]*)\)")
_EXCLUDED = re.compile(r"(failed on \d+ pods? in the last [0-9.]+ h \(measured policy\)): (.*)$")
_NOTE_CLUSTER = re.compile(r"(?:^|; )([A-Za-z0-9][A-Za-z0-9._-]*)/")
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
    if reason == FLEET_HALT_POINTER:  # a decision's pointer to the rollout: no names
        return reason
    found = _CLUSTERS.findall(reason)
    if not found:
        return OUTSIDE
    named = {c.strip() for group in found for c in group.split(",") if c.strip()}
    return reason if all(principal.may_see(c) for c in named) else OUTSIDE


def rollout(principal: Principal, shown: dict[str, Any]) -> dict[str, Any]:
    """A rollout as the API shows it (a dict), with ``failed_pods`` cut to the caller's
    clusters and ``failed_pods_outside_scope`` counting the rest, ``failure_sources``
    left out; ``failures`` stays the total (what the guard counted toward
    ``max_failures``)."""
    if not principal.restricted:
        return shown
    failed = [str(p) for p in shown.get("failed_pods") or ()]
    mine = [p for p in failed if sees_pod(principal, p)]
    out = {**shown, "failed_pods": mine, "failed_pods_outside_scope": len(failed) - len(mine)}
    out["halted_reason"] = halt_reason(principal, shown.get("halted_reason"))
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


def exclusion(principal: Principal, reason: str) -> str:
    """A measured-policy exclusion (``failed on N pods ...: cluster/pod time: error;
    ...``) as this caller may read it: kept when every pod it quotes is of a cluster in
    scope; otherwise the count stays and the pods and errors go (a cluster may trust
    other clusters' evidence, whose failures then exclude its backends). Read from the
    service's own text, so on doubt it redacts: a quoted error that looks like
    another cluster's pod hides the list."""
    m = _EXCLUDED.search(reason) if principal.restricted else None
    if m is None:
        return reason
    named = _NOTE_CLUSTER.findall(m.group(2))
    if named and all(principal.may_see(c) for c in named):
        return reason
    return f"{reason[: m.start()]}{m.group(1)}: {OUTSIDE_PODS}"


OUTSIDE_PODS = "pods in clusters outside your scope, not named"
"""What a scoped caller reads in place of an exclusion's pods when some are not its."""


def text(principal: Principal, value: str) -> str:
    """Any text of an answer that may quote a halt or exclusion reason."""
    m = _HALTED.match(value)
    if m is not None:
        value = f"{m.group(1)}{halt_reason(principal, m.group(2))}{m.group(3)}"
    return exclusion(principal, value)


def decision_answer(principal: Principal, answer: dict[str, Any]) -> dict[str, Any]:
    """A stored answer of one of the caller's clusters, its messages and per-backend
    reasons redacted: a fleet rollout halted by other clusters' pods, a backend
    excluded by failures in clusters its cluster trusts."""
    if not principal.restricted:
        return answer
    out = texts(principal, answer)
    assert isinstance(out, dict)
    return out


def summary(principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    """``/v1/selections/summary`` (already cut to the caller's clusters): rollouts and
    exclusion reasons redacted."""
    if not principal.restricted:
        return body
    out = dict(body)
    out["rollouts"] = [
        {**r, "rollout": rollout(principal, r["rollout"])} for r in body.get("rollouts", ())
    ]
    out["excluded"] = {
        cluster: {b: exclusion(principal, why) for b, why in reasons.items()}
        for cluster, reasons in (body.get("excluded") or {}).items()
    }
    return out


def texts(principal: Principal, value: Any) -> Any:
    """Every text in ``value`` (JSON-shaped: dicts, lists, strings) through :func:`text`."""
    if isinstance(value, str):
        return text(principal, value)
    if isinstance(value, list):
        return [texts(principal, v) for v in value]
    if isinstance(value, dict):
        return {k: texts(principal, v) for k, v in value.items()}
    return value
