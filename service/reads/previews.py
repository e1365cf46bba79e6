"""What a proposed change (rules, or one scope's override) would do to the pods a
caller may see: the fleet reads' preview, scoped to the caller's token."""

from __future__ import annotations

from dataclasses import dataclass

from mla_switchboard.core.schemas import Override, RulesDocument
from mla_switchboard.service.auth import Principal
from mla_switchboard.service.fleet.preview import Preview
from mla_switchboard.service.fleet.reads import FleetReads, Proposal


@dataclass(eq=False)
class Previews:
    reads: FleetReads

    def preview(
        self,
        *,
        principal: Principal | None,
        rules: RulesDocument | None = None,
        override_scope: str | None = None,
        override: Override | None = None,
    ) -> Preview:
        """What a change would do; ``principal``: the caller, when it may see only some
        clusters' pods (None: all)."""
        restricted = principal is not None and principal.restricted
        scope = principal.clusters if restricted and principal is not None else None
        visible = principal.may_see if restricted and principal is not None else None
        return self.reads.preview(Proposal(rules, override_scope, override), scope, visible)

    def kept_preview(
        self,
        *,
        principal: Principal | None,
        rules: RulesDocument | None = None,
        override_scope: str | None = None,
        override: Override | None = None,
    ) -> Preview | None:
        """``preview``'s answer when it is kept and current, without I/O (the event loop
        may ask before handing a miss to a worker thread)."""
        restricted = principal is not None and principal.restricted
        scope = principal.clusters if restricted and principal is not None else None
        return self.reads.kept_preview(Proposal(rules, override_scope, override), scope)
