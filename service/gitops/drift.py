"""Drift: how live state differs from the last file applied, and the hand changes
since. The file is the ``overrides.apply`` audit entry its apply wrote (kept in the
same transaction), so every replica reads the same one; what differs is what an apply
of that file would change again (``diff.compare``), within the scope and with the
``prune`` of that apply."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mla_switchboard.service.gitops.diff import Diff, compare
from mla_switchboard.service.gitops.document import OverridesFile
from mla_switchboard.service.identity.auth import OutOfScope, Principal
from mla_switchboard.service.live.poller import LiveConfig
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


@dataclass(frozen=True)
class _Look:
    """What drift is at one configuration version (every change of an override or the
    rules moves it, so it is kept until the version moves)."""

    version: int
    applied: Applied | None
    diff: Diff
    hand_changes: list[dict[str, Any]]


@dataclass(eq=False)
class Drift:
    audit: AuditStore
    live: LiveConfig
    metrics: Metrics
    _kept: _Look | None = field(default=None, init=False)

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
        look = self._look()
        applied = look.applied
        if applied is None:
            return {"managed": False, "drifted": False, "resources": [], "hand_changes": []}
        resources = [
            _redacted(principal, c.shown())
            for c in look.diff.changes
            if c.resource == "rules" or principal.may_see(c.target)
        ]
        hands = [
            h for h in look.hand_changes if h["target"] == "rules" or principal.may_see(h["target"])
        ]
        return {
            "managed": True,
            "file_revision": applied.revision,
            "applied_at": applied.at,
            "applied_by": applied.actor,
            "drifted": bool(resources),
            "resources": resources,
            "hand_changes": hands,
        }

    def _drifted(self) -> float:
        """The gauge's value at a scrape; a store that does not answer leaves the last
        value (a scrape must not fail for it)."""
        try:
            return float(len(self._look().diff.changes))
        except SQLAlchemyError:
            return float(len(self._kept.diff.changes)) if self._kept is not None else 0.0

    def _look(self) -> _Look:
        """Drift now: read again (two store reads and a comparison) only when the
        configuration moved; a scrape or a dashboard between two changes is a lookup."""
        version = self.live.current().version
        kept = self._kept
        if kept is not None and kept.version == version:
            return kept
        applied = self._applied()
        if applied is None:
            look = _Look(version, None, Diff(), [])
        else:
            look = _Look(version, applied, self._diff(applied), self._hand_changes(applied))
        self._kept = look
        return look

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

    def _hand_changes(self, applied: Applied) -> list[dict[str, Any]]:
        rows = self.audit.list_audit(
            action=None, target=None, actor=None, limit=HAND_SCAN, before_id=None
        )
        return [
            {k: r[k] for k in ("id", "at", "actor", "action", "target", "note")}
            for r in rows
            if r["id"] > applied.audit_id
            and r["action"] in HAND_ACTIONS
            and not (r["note"] or "").startswith("overrides file rev ")
        ]


def _redacted(principal: Principal, shown: dict[str, Any]) -> dict[str, Any]:
    """A drifted resource as the caller may read it: the rules' contents name every
    cluster's rule set, so a token limited to some clusters is told only that they
    drifted (``GET /v1/rules`` shows it what it may read of them)."""
    if shown["resource"] == "rules" and principal.restricted:
        return {**shown, "before": None, "after": None}
    return shown
