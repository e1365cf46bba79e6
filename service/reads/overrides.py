"""The overrides in force as a caller's token may read them."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from mla_switchboard.core.schemas import Override
from mla_switchboard.service.identity.auth import Principal
from mla_switchboard.service.reads import scope


def visible(principal: Principal, overrides: Iterable[Override]) -> list[Override]:
    """The overrides of the caller's clusters and the fleet's, by cluster."""
    return sorted((o for o in overrides if principal.may_see(o.cluster)), key=lambda o: o.cluster)


def shown(o: Override, now: datetime) -> dict[str, Any]:
    """An override as the API shows it, expired or not: what a write answers with
    and what a read shows, before any scope applies."""
    d = o.model_dump(mode="json")
    d["expired"] = o.expires_at is not None and o.expires_at <= now
    return d


def shown_to(principal: Principal, o: Override, now: datetime) -> dict[str, Any]:
    """One override as the API shows it to this caller (``reads/scope.py``)."""
    out = scope.override(principal, shown(o, now))
    assert out is not None
    return out
