"""What a declarative file changes against what is in force: each override created,
changed or removed, and the rules, each with the live resource's ETag (what apply
sends back as If-Match), for one caller's scope."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from mla_switchboard.core.schemas import FLEET, Override, OverrideSpec, RulesDocument
from mla_switchboard.service.gitops.document import FileRules, OverridesFile, file_form, spec_of
from mla_switchboard.service.identity.auth import OutOfScope, Principal
from mla_switchboard.service.state import override_etag, rules_etag
from mla_switchboard.service.writes.rules import scoped_merge

ABSENT = '"none"'
"""The ETag of an override that does not exist (what ``PUT`` with If-Match takes)."""

RULES = "rules"
"""The target name of the rules in a plan (no cluster may be called that and be
confused with it: overrides are told apart by ``resource``)."""

Action = Literal["create", "update", "delete"]


@dataclass(frozen=True)
class Change:
    """One resource the file changes: ``etag`` is the live one's, ``before`` and
    ``after`` are as the file writes them (None: absent)."""

    resource: Literal["override", "rules"]
    target: str
    action: Action
    etag: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    spec: OverrideSpec | None = None
    rules: RulesDocument | None = None

    def shown(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "target": self.target,
            "action": self.action,
            "etag": self.etag,
            "before": self.before,
            "after": self.after,
        }


@dataclass(frozen=True)
class Diff:
    changes: list[Change] = field(default_factory=list)
    unmanaged: list[str] = field(default_factory=list)
    """Live overrides the file does not list, kept because ``prune`` was not asked."""

    def etags(self) -> dict[str, str]:
        return {key(c.resource, c.target): c.etag for c in self.changes}


def key(resource: str, target: str) -> str:
    """How a plan names a resource in its ETags: ``rules`` or ``override:<scope>``."""
    return RULES if resource == "rules" else f"override:{target}"


def compare(
    principal: Principal,
    document: OverridesFile,
    rules: RulesDocument,
    overrides: Iterable[Override],
    *,
    prune: bool,
) -> Diff | OutOfScope:
    """The changes ``document`` makes to ``rules`` and ``overrides`` (what is in force),
    or why ``principal`` may not make one of them. Only the overrides the caller may
    see are compared: a token limited to some clusters declares (and prunes) its own."""
    live = {o.cluster: o for o in overrides if principal.may_see(o.cluster)}
    changes: list[Change] = []
    if document.rules is not None:
        found = _rules_change(principal, document.rules, rules)
        if isinstance(found, OutOfScope):
            return found
        if found is not None:
            changes.append(found)
    for cluster in sorted(document.overrides):
        spec = document.overrides[cluster]
        current = live.get(cluster)
        if current is None:
            changes.append(
                Change("override", cluster, "create", ABSENT, None, file_form(spec), spec)
            )
            continue
        was = spec_of(current)
        if was.model_dump() != spec.model_dump():
            etag = override_etag(cluster, current.revision)
            changes.append(
                Change("override", cluster, "update", etag, file_form(was), file_form(spec), spec)
            )
    unlisted = sorted(c for c in live if c not in document.overrides)
    if prune:
        for cluster in unlisted:
            was_form = file_form(spec_of(live[cluster]))
            etag = override_etag(cluster, live[cluster].revision)
            changes.append(Change("override", cluster, "delete", etag, was_form, None))
    for change in changes:
        if change.resource == "override" and not principal.may_touch(change.target):
            return OutOfScope(_out_of_scope(principal, change.target))
    return Diff(changes, [] if prune else unlisted)


def _rules_change(
    principal: Principal, declared: FileRules, live: RulesDocument
) -> Change | OutOfScope | None:
    try:
        proposed = scoped_merge(principal, declared.document())(live)
    except OutOfScope as exc:
        return exc
    if proposed.rules_only() == live.rules_only():
        return None
    before, after = _visible_rules(principal, live), _visible_rules(principal, proposed)
    etag = rules_etag(live.revision or 0)
    return Change("rules", RULES, "update", etag, before, after, rules=proposed)


def _visible_rules(principal: Principal, rules: RulesDocument) -> dict[str, Any]:
    """The rules as the caller may read them: a token limited to some clusters sees the
    fleet lists and its clusters' rule sets only (as ``GET /v1/rules`` shows them)."""
    shown = FileRules.of(rules).model_dump(mode="json")
    if principal.restricted:
        shown["clusters"] = {c: r for c, r in shown["clusters"].items() if principal.may_see(c)}
    return shown


def _out_of_scope(principal: Principal, cluster: str) -> str:
    if cluster == FLEET:
        return (
            f"token {principal.name!r} is limited to clusters; the fleet override '*' "
            "needs an unrestricted admin token"
        )
    return principal.out_of_scope(cluster)
