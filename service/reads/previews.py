"""What a proposed change (rules, or one scope's override) would do to the pods a
caller may see: the fleet reads' preview, scoped to the caller's token."""

from __future__ import annotations

from dataclasses import dataclass

from mla_switchboard.service.auth import Principal
from mla_switchboard.service.fleet.preview import Preview
from mla_switchboard.service.fleet.reads import FleetReads, Proposal, Visible


@dataclass(eq=False)
class Previews:
    reads: FleetReads

    def preview(self, principal: Principal | None, proposal: Proposal) -> Preview:
        """What ``proposal`` would do; ``principal``: the caller, when it may see only
        some clusters' pods (None: all)."""
        scope, visible = _view(principal)
        return self.reads.preview(proposal, scope, visible)

    def kept_preview(self, principal: Principal | None, proposal: Proposal) -> Preview | None:
        """``preview``'s answer when it is kept and current, without I/O (the event loop
        may ask before handing a miss to a worker thread)."""
        scope, _ = _view(principal)
        return self.reads.kept_preview(proposal, scope)


def _view(principal: Principal | None) -> tuple[tuple[str, ...] | None, Visible]:
    """The clusters a token limited to some may see, and the test of a cluster (None,
    None: every cluster)."""
    if principal is None or not principal.restricted:
        return None, None
    return principal.clusters, principal.may_see
