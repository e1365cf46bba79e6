"""``POST /v1/plan`` and ``POST /v1/apply``: what a declarative file changes and does
to the recorded fleet, and making it so in one transaction.

A plan names every resource it changes with the live ETag it read; apply writes only
when each of those is still what the plan read (and every change it would make is one
the plan showed), so a console edit between the two makes apply refuse (412) instead
of overwriting it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.service.fleet.preview import Preview
from mla_switchboard.service.gitops.diff import Change, Diff, compare
from mla_switchboard.service.gitops.document import OverridesFile, content_revision
from mla_switchboard.service.gitops.proposal import combined
from mla_switchboard.service.identity.auth import OutOfScope, Principal
from mla_switchboard.service.live.poller import LiveConfig
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.outcomes import Done, Outcome, Problem
from mla_switchboard.service.reads.previews import Previews
from mla_switchboard.service.store.base import OutcomeUnknown
from mla_switchboard.service.store.config import ConfigStore
from mla_switchboard.service.store.config_apply import OverrideWrite, Stale, apply_changes
from mla_switchboard.service.writes.flow import WriteFlow, unknown
from mla_switchboard.service.writes.managed import SYNC_ID, ManagedScopes

AUDIT_CHANGES = 20
"""Preview rows an audit entry keeps per change (as a console write's does)."""


@dataclass(eq=False)
class OverridesAsCode:
    config: ConfigStore
    live: LiveConfig
    previews: Previews
    flow: WriteFlow
    metrics: Metrics
    managed: ManagedScopes = field(default_factory=ManagedScopes)
    """What a file synced in declarative mode owns: no other apply may change it."""

    def plan(self, principal: Principal, document: OverridesFile, *, prune: bool) -> Outcome:
        """Every change of ``document`` and what they do together to the fleet."""
        diff = self._diff(principal, document, prune=prune, fresh=False)
        if isinstance(diff, Problem):
            return diff
        preview = self._preview(principal, diff)
        return Done(_plan_body(document, diff, preview))

    def apply(
        self,
        principal: Principal,
        document: OverridesFile,
        *,
        prune: bool,
        revision: str | None,
        etags: Mapping[str, str],
    ) -> Outcome:
        """Apply ``document`` when every resource ``etags`` names (the plan's) is as the
        plan read it and the plan showed every change; otherwise 412 and nothing."""
        hidden = _unseen(principal, etags)
        if hidden is not None:  # its ETag would say whether it exists, and its revision
            return Problem(403, principal.out_of_scope(hidden))
        diff = self._diff(principal, document, prune=prune, fresh=True)
        if isinstance(diff, Problem):
            return diff
        refused = self._owned_elsewhere(principal, diff)
        if refused is not None:
            return Problem(409, refused)
        unplanned = sorted(k for k in diff.etags() if k not in etags)
        if unplanned:
            return Problem(
                412,
                f"{unplanned[0]} changed since the plan (the plan did not include this change); "
                "plan again and review it",
                extra={"target": unplanned[0], "current_etag": diff.etags()[unplanned[0]]},
            )
        rev = revision or content_revision(document)
        if not diff.changes:
            return Done(_apply_body(rev, [], None))
        preview = self._preview(principal, diff)
        writes = [
            OverrideWrite(c.target, c.spec, _audit_preview(preview, c, rev))
            for c in diff.changes
            if c.resource == "override"
        ]
        rules = next((c.rules for c in diff.changes if c.rules is not None), None)
        try:
            result = apply_changes(
                self.config.engine,
                rules=rules,
                overrides=writes,
                expected=dict(etags),
                actor=principal.actor,
                note=f"overrides file rev {rev}",
                applied_file={
                    "revision": rev,
                    "prune": prune,
                    "scope": principal.clusters,
                    "file": document.sent(),
                },
            )
        except OutcomeUnknown as exc:
            return unknown(exc, None)
        if isinstance(result, Stale):
            return Problem(
                412,
                f"{result.target} changed since the plan (If-Match is stale); plan again",
                extra={"target": result.target, "current_etag": result.current_etag},
            )
        for c in diff.changes:
            if c.resource == "override":
                self.metrics.override_writes.labels("delete" if c.spec is None else "put").inc()
        body = _apply_body(rev, diff.changes, preview)
        return Done(body | self.flow.applied())

    def _diff(
        self, principal: Principal, document: OverridesFile, *, prune: bool, fresh: bool
    ) -> Diff | Problem:
        if fresh:
            self.live.reload()  # apply compares with what is stored, not this replica's copy
        snapshot = self.live.current()
        found = compare(principal, document, snapshot.rules, snapshot.overrides, prune=prune)
        if isinstance(found, OutOfScope):
            return Problem(403, str(found))
        now = datetime.now(UTC)
        for c in found.changes:
            spec = c.spec
            if spec is not None and spec.expires_at is not None and spec.expires_at <= now:
                return Problem(
                    422,
                    f"overrides.{c.target}.expires_at is in the past",
                    field=("body", "file", "overrides", c.target, "expires_at"),
                )
        return found

    def _owned_elsewhere(self, principal: Principal, diff: Diff) -> str | None:
        if principal.id == SYNC_ID:
            return None
        for c in diff.changes:
            why = self.managed.rules() if c.resource == "rules" else self.managed.override(c.target)
            if why is not None:
                return why
        return None

    def _preview(self, principal: Principal, diff: Diff) -> Preview | None:
        if not diff.changes:
            return None
        return self.previews.preview(
            principal, combined(diff.changes, principal, datetime.now(UTC))
        )


def _unseen(principal: Principal, etags: Mapping[str, str]) -> str | None:
    """The first cluster an ETag is sent for that the caller may not see (None: none)."""
    for name in sorted(etags):
        cluster = name.removeprefix("override:")
        if name != "rules" and not principal.may_see(cluster):
            return cluster
    return None


def _plan_body(document: OverridesFile, diff: Diff, preview: Preview | None) -> dict[str, Any]:
    return {
        "revision": content_revision(document),
        "changed": bool(diff.changes),
        "summary": _counts(diff.changes),
        "changes": [c.shown() for c in diff.changes],
        "unmanaged": diff.unmanaged,
        "etags": diff.etags(),
        "preview": None if preview is None else preview.model_dump(),
    }


def _apply_body(rev: str, changes: list[Change], preview: Preview | None) -> dict[str, Any]:
    return {
        "revision": rev,
        "applied": bool(changes),
        "summary": _counts(changes),
        "changes": [c.shown() for c in changes],
        "preview": None if preview is None else preview.model_dump(),
    }


def _counts(changes: list[Change]) -> dict[str, int]:
    out = {"create": 0, "update": 0, "delete": 0}
    for c in changes:
        out[c.action] += 1
    return out


def _audit_preview(preview: Preview | None, change: Change, rev: str) -> dict[str, Any]:
    """What a change's audit entry keeps: the file's revision and the plan's rows of
    that change's cluster (every cluster's, for ``*``)."""
    rows = [] if preview is None else preview.model_dump()["changes"]
    mine = [r for r in rows if change.target in ("*", r["cluster"])]
    return {
        "file_revision": rev,
        "pods_changed": sum(r["pods"] for r in mine),
        "changes": mine[:AUDIT_CHANGES],
    }
