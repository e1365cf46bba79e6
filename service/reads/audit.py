"""The append-only audit log as a caller's token may read it, newest first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mla_switchboard.service.identity.auth import Principal
from mla_switchboard.service.reads import scope
from mla_switchboard.service.store.audit import AuditStore


@dataclass(eq=False)
class AuditReads:
    audit: AuditStore

    def page(
        self,
        principal: Principal,
        *,
        action: str | None,
        target: str | None,
        actor: str | None,
        limit: int,
        cursor: str | None,
    ) -> dict[str, Any]:
        """Entries older than ``cursor`` (an entry id) and the next page's cursor."""
        before = None if cursor is None else int(cursor)
        if not principal.restricted:
            rows = self.audit.list_audit(
                action=action, target=target, actor=actor, limit=limit + 1, before_id=before
            )
            more = len(rows) > limit
            rows = rows[:limit]
            return {"items": rows, "next_cursor": str(rows[-1]["id"]) if more else None}
        # A token limited to some clusters: those clusters' override (and rollout)
        # entries, and rules changes shown with only the fleet lists and its clusters'
        # rule sets; token entries are not shown. Paged by scanning, at most SCAN_LIMIT
        # rows a request.
        found: list[dict[str, Any]] = []
        scanned = 0
        while len(found) < limit and scanned < SCAN_LIMIT:
            batch = self.audit.list_audit(
                action=action, target=target, actor=actor, limit=500, before_id=before
            )
            for row in batch:
                scanned += 1
                before = row["id"]
                shown = _audit_entry_for(principal, row)
                if shown is not None:
                    found.append(shown)
                    if len(found) == limit:
                        break
            if len(batch) < 500 and len(found) < limit:
                return {"items": found, "next_cursor": None}
        return {"items": found, "next_cursor": None if before is None else str(before)}


SCAN_LIMIT = 10_000


def _audit_entry_for(principal: Principal, row: dict[str, Any]) -> dict[str, Any] | None:
    action = str(row["action"])
    if isinstance(row.get("preview"), dict):
        row = {**row, "preview": scoped_preview(principal, row["preview"])}
    if action.startswith(("override.", "rollout.")):
        if not principal.may_see(str(row["target"])):
            return None
        return scope.audit_entry(principal, row)
    if action == "rules.replace":

        def visible(document: Any) -> Any:
            if not isinstance(document, dict):
                return document
            clusters = document.get("clusters") or {}
            return {
                **document,
                "clusters": {c: r for c, r in clusters.items() if principal.may_see(c)},
            }

        return {**row, "before": visible(row["before"]), "after": visible(row["after"])}
    return None


def scoped_preview(principal: Principal, preview: dict[str, Any]) -> dict[str, Any]:
    """A stored preview as a token limited to some clusters may see it: the rows of
    its clusters only, their reasons redacted (``reads/scope.py``)."""
    if not principal.restricted:
        return preview
    out = dict(preview)
    for field in ("changes", "invalid"):
        if isinstance(out.get(field), list):
            out[field] = [
                row
                for row in out[field]
                if isinstance(row, dict) and principal.may_see(str(row.get("cluster")))
            ]
    if isinstance(out.get("clusters_affected"), list):
        out["clusters_affected"] = [c for c in out["clusters_affected"] if principal.may_see(c)]
    redacted: dict[str, Any] = scope.preview(principal, out)
    return redacted
