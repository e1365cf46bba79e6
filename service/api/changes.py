"""What every admin write shares: preview, If-Match handling, reload and metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mla_switchboard.core.schemas import Override, RulesDocument
from mla_switchboard.service.api.deps import fail
from mla_switchboard.service.auth import Principal
from mla_switchboard.service.fleet.preview import Preview
from mla_switchboard.service.fleet.reads import Proposal
from mla_switchboard.service.runtime import Runtime
from mla_switchboard.service.state import Conflict


def preview_change(
    runtime: Runtime,
    *,
    rules: RulesDocument | None = None,
    override_scope: str | None = None,
    override: Override | None = None,
    principal: Principal | None = None,
) -> Preview:
    """Replay the current fleet against the config with the proposed change applied.

    ``override_scope`` set with ``override=None`` previews deleting that override.
    ``principal``: the caller, when it may see only some clusters' pods (None: all).
    The fleet is replayed by group (``service/fleet/preview.py``) and the answer kept per
    versions and proposal (``service/fleet/reads.py``)."""
    scope, visible = _scope_of(principal)
    return runtime.reads.preview(Proposal(rules, override_scope, override), scope, visible)


def kept_preview(
    runtime: Runtime,
    *,
    rules: RulesDocument | None = None,
    override_scope: str | None = None,
    override: Override | None = None,
    principal: Principal | None = None,
) -> Preview | None:
    """``preview_change``'s answer when it is kept and current, without I/O (the event
    loop may ask before handing a miss to a worker thread)."""
    scope, _ = _scope_of(principal)
    return runtime.reads.kept_preview(Proposal(rules, override_scope, override), scope)


def _scope_of(
    principal: Principal | None,
) -> tuple[tuple[str, ...] | None, Callable[[str], bool] | None]:
    if principal is None or not principal.restricted:
        return None, None
    return principal.clusters, principal.may_see


def scoped_preview(principal: Principal, preview: dict[str, Any]) -> dict[str, Any]:
    """A stored preview as a token limited to some clusters may see it: the rows of
    its clusters only."""
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
    return out


def committed(runtime: Runtime, result: Any, what: str) -> Any:
    """Turn a store write's result into the answer: 412 on a stale If-Match, and make
    this replica see its own write at once (others follow within the poll interval)."""
    if isinstance(result, Conflict):
        fail(
            412,
            f"{what} changed since you read it (If-Match is stale); read it again and retry",
            current_etag=result.current_etag,
        )
    runtime.live.reload()
    return result
