"""Drift: how live state differs from the last file applied, and the hand changes
since. The file is the ``overrides.apply`` audit entry its apply wrote (kept in the
same transaction), so every replica reads the same one; what differs is what an apply
of that file would change again (``diff.compare``), within the scope and with the
``prune`` of that apply."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mla_switchboard.service.auth import OutOfScope, Principal
from mla_switchboard.service.gitops.diff import Diff, compare
from mla_switchboard.service.gitops.document import OverridesFile
from mla_switchboard.service.live import LiveConfig
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.audit import AuditStore
from mla_switchboard.service.store.config_apply import APPLY_ACTION
from prometheus_client import Gauge
from sqlalchemy.exc import SQLAlchemyError

HAND_ACTIONS = ("override.put", "override.delete", "rules.replace")
"""Audit actions that change what a file declares (a rollout's halt, resume or
promote changes its state, which the file does not hold, and is not drift)."""
HAND_SCAN = 200
"""Audit entries read after the apply's, newest first, for the hand changes."""


@dataclass(frozen=True)
class Applied:
    """The last file applied, as its audit entry keeps it."""

    audit_id: int
    at: str
    actor: str
    revision: str
    prune: bool
    scope: tuple[str, ...] | None
    document: OverridesFile

    @classmethod
    def of(cls, entry: dict[str, Any]) -> Applied:
        kept = entry["after"]
        scope = kept.get("scope")
        return cls(
            audit_id=entry["id"],
            at=entry["at"],
            actor=entry["actor"],
            revision=kept["revision"],
            prune=bool(kept.get("prune")),
            scope=None if scope is None else tuple(scope),
            document=OverridesFile.model_validate(kept["file"]),
        )


@dataclass(eq=False)
class Drift:
    audit: AuditStore
    live: LiveConfig
    metrics: Metrics
    _kept: tuple[int, Applied | None, int] | None = field(default=None, init=False)
    """(config version read at, the file, resources drifted) of the last look."""

    def __post_init__(self) -> None:
        gauge = Gauge(
            "switchboard_overrides_drift",
            "Resources (overrides, rules) whose live state differs from the last applied "
            "overrides file (0 also when none was applied)",
            registry=self.metrics.registry,
        )
        gauge.set_function(self._drifted)

    def report(self, principal: Principal) -> dict[str, Any]:
        """What ``GET /v1/drift`` answers: the last file applied, the resources that
        differ from it now (what its apply would do again) and the hand changes since,
        of the clusters the caller may see."""
        applied = self._applied()
        if applied is None:
            return {"managed": False, "drifted": False, "resources": [], "hand_changes": []}
        diff = self._diff(applied)
        resources = [
            _redacted(principal, c.shown())
            for c in diff.changes
            if c.resource == "rules" or principal.may_see(c.target)
        ]
        return {
            "managed": True,
            "file_revision": applied.revision,
            "applied_at": applied.at,
            "applied_by": applied.actor,
            "drifted": bool(resources),
            "resources": resources,
            "hand_changes": self._hand_changes(applied, principal),
        }

    def _drifted(self) -> float:
        """The gauge's value at a scrape; a store that does not answer leaves the last
        value (a scrape must not fail for it)."""
        try:
            return float(self._look()[1])
        except SQLAlchemyError:
            return float(self._kept[2]) if self._kept is not None else 0.0

    def _look(self) -> tuple[Applied | None, int]:
        """The last file and how many resources drifted, read again when the
        configuration moved (a scrape between two changes is a lookup)."""
        version = self.live.current().version
        kept = self._kept
        if kept is not None and kept[0] == version:
            return kept[1], kept[2]
        applied = self._applied()
        drifted = 0 if applied is None else len(self._diff(applied).changes)
        self._kept = (version, applied, drifted)
        return applied, drifted

    def _applied(self) -> Applied | None:
        rows = self.audit.list_audit(
            action=APPLY_ACTION, target=None, actor=None, limit=1, before_id=None
        )
        return Applied.of(rows[0]) if rows else None

    def _diff(self, applied: Applied) -> Diff:
        snapshot = self.live.current()
        applier = Principal(name=applied.actor, role="admin", clusters=applied.scope, id="drift")
        found = compare(
            applier, applied.document, snapshot.rules, snapshot.overrides, prune=applied.prune
        )
        return Diff() if isinstance(found, OutOfScope) else found

    def _hand_changes(self, applied: Applied, principal: Principal) -> list[dict[str, Any]]:
        rows = self.audit.list_audit(
            action=None, target=None, actor=None, limit=HAND_SCAN, before_id=None
        )
        return [
            {k: r[k] for k in ("id", "at", "actor", "action", "target", "note")}
            for r in rows
            if r["id"] > applied.audit_id
            and r["action"] in HAND_ACTIONS
            and not (r["note"] or "").startswith("overrides file rev ")
            and (r["target"] == "rules" or principal.may_see(r["target"]))
        ]


def _redacted(principal: Principal, shown: dict[str, Any]) -> dict[str, Any]:
    """A drifted resource as the caller may read it: the rules' contents name every
    cluster's rule set, so a token limited to some clusters is told only that they
    drifted (``GET /v1/rules`` shows it what it may read of them)."""
    if shown["resource"] == "rules" and principal.restricted:
        return {**shown, "before": None, "after": None}
    return shown
