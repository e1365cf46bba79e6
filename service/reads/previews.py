"""What a proposed change (rules, or one scope's override) would do to the pods a
caller may see: the fleet reads' preview, scoped to the caller's token."""

from __future__ import annotations

from dataclasses import dataclass

from mla_switchboard.service.fleet.preview import Preview
from mla_switchboard.service.fleet.reads import FleetReads, Proposal, Visible
from mla_switchboard.service.identity.auth import Principal
from mla_switchboard.service.reads import scope


@dataclass(eq=False)
class Previews:
    reads: FleetReads

    def preview(self, principal: Principal | None, proposal: Proposal) -> Preview:
        """What ``proposal`` would do; ``principal``: the caller, when it may see only
        some clusters' pods (None: all)."""
        clusters, visible = _view(principal)
        return _shown(principal, self.reads.preview(proposal, clusters, visible))

    def kept_preview(self, principal: Principal | None, proposal: Proposal) -> Preview | None:
        """``preview``'s answer when it is kept and current, without I/O (the event loop
        may ask before handing a miss to a worker thread)."""
        clusters, _ = _view(principal)
        kept = self.reads.kept_preview(proposal, clusters)
        return None if kept is None else _shown(principal, kept)


def _shown(principal: Principal | None, preview: Preview) -> Preview:
    """The preview's reasons as the caller may read them (``reads/scope.py``): its
    rows are its clusters', but a reason may quote a fleet rollout's halt or another
    cluster's failing pods."""
    if principal is None or not principal.restricted:
        return preview
    return Preview.model_validate(scope.preview(principal, preview.model_dump(by_alias=True)))


def _view(principal: Principal | None) -> tuple[tuple[str, ...] | None, Visible]:
    """The clusters a token limited to some may see, and the test of a cluster (None,
    None: every cluster)."""
    if principal is None or not principal.restricted:
        return None, None
    return principal.clusters, principal.may_see
