"""Rules writes: a PUT of the rules document, previewed first, merged into the stored
revision within the writer's cluster scope (``scoped_merge``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mla_switchboard.core.schemas import RulesDocument
from mla_switchboard.service.fleet.reads import Proposal
from mla_switchboard.service.identity.auth import OutOfScope, Principal
from mla_switchboard.service.live.poller import LiveConfig
from mla_switchboard.service.outcomes import Done, Outcome, Problem
from mla_switchboard.service.reads.previews import Previews
from mla_switchboard.service.state import rules_etag
from mla_switchboard.service.store.config import ConfigStore
from mla_switchboard.service.writes.flow import IdempotencyKey, WriteFlow, with_etag
from mla_switchboard.service.writes.managed import ManagedScopes


@dataclass(eq=False)
class RulesWrites:
    config: ConfigStore
    live: LiveConfig
    previews: Previews
    flow: WriteFlow
    managed: ManagedScopes = field(default_factory=ManagedScopes)
    """The rules are refused to the console while a synced file declares them."""

    def put_rules(
        self,
        principal: Principal,
        document: RulesDocument,
        *,
        if_match: str | None,
        dry_run: bool,
        note: str | None,
        key: IdempotencyKey | None,
    ) -> Outcome:
        if (owned := self.managed.rules()) is not None:
            return Problem(409, owned)
        if if_match is None and document.revision is not None:
            # the document says which revision it was read from: a stale one is a 412,
            # as with If-Match (a replica that had not seen another admin's change
            # handed it out, and writing it back would revert that change)
            if_match = rules_etag(document.revision)
        merge = scoped_merge(principal, document)
        try:
            proposed = merge(self.live.current().rules)
        except OutOfScope:
            self.live.reload()  # this replica's copy may be behind the store's
            try:
                proposed = merge(self.live.current().rules)
            except OutOfScope as exc:
                return Problem(403, str(exc))
        preview = self.previews.preview(principal, Proposal(rules=proposed))
        if dry_run:
            return Done({"dry_run": True, "preview": preview.model_dump()})

        def respond(stored: RulesDocument) -> tuple[int, dict[str, Any]]:
            return 200, {"rules": stored.model_dump(mode="json"), "preview": preview.model_dump()}

        try:
            outcome = self.flow.write(
                principal,
                key,
                respond,
                lambda idem: self.config.put_rules(
                    proposed,
                    actor=principal.actor,
                    if_match=if_match,
                    note=note,
                    preview={k: v for k, v in preview.model_dump().items() if k != "invalid"},
                    merge=merge,
                    idempotency=idem,
                ),
                what="rules",
            )
        except OutOfScope as exc:
            return Problem(403, str(exc))
        if isinstance(outcome, Done):
            revision = outcome.body.get("rules", {}).get("revision") or 0
            outcome = with_etag(outcome, rules_etag(revision))
        return outcome


def scoped_merge(
    principal: Principal, document: RulesDocument
) -> Callable[[RulesDocument], RulesDocument]:
    """What a PUT of ``document`` by ``principal`` makes of the rules stored now.

    An unrestricted admin replaces the document. A token limited to some clusters
    changes only the rule sets of its clusters: the stored rule sets of every other
    cluster are kept whatever the document says of them (it sees only its own in GET),
    and the fleet lists must be the stored ones. Applied by the store to the revision
    it holds, inside the write's transaction, so a replica's stale copy can never
    carry an old fleet list (or another cluster's rule set) back in.
    """

    def merge(current: RulesDocument) -> RulesDocument:
        if not principal.restricted:
            return document
        if current.default != document.default or current.by_capability != document.by_capability:
            raise OutOfScope(
                f"token {principal.name!r} is limited to clusters; the fleet lists (default, "
                "by_capability) need an unrestricted admin token"
            )
        outside = sorted(c for c in document.clusters if not principal.may_touch(c))
        if outside:
            scope = ", ".join(principal.clusters or ())
            raise OutOfScope(
                f"token {principal.name!r} is limited to clusters {scope}; not {outside[0]!r}"
            )
        kept = {c: r for c, r in current.clusters.items() if not principal.may_touch(c)}
        return document.model_copy(update={"clusters": {**kept, **document.clusters}})

    return merge
