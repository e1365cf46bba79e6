"""What every admin write shares: preview, If-Match handling, reload and metrics."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core.schemas import Override, RulesDocument
from mla_switchboard.service.api.deps import fail
from mla_switchboard.service.preview import Preview, replay, with_override
from mla_switchboard.service.runtime import Runtime
from mla_switchboard.service.state import Conflict


def preview_change(
    runtime: Runtime,
    *,
    rules: RulesDocument | None = None,
    override_scope: str | None = None,
    override: Override | None = None,
) -> Preview:
    """Replay the current fleet against the config with the proposed change applied.

    ``override_scope`` set with ``override=None`` previews deleting that override.
    """
    current = runtime.inputs
    overrides = current.overrides
    if override_scope is not None:
        overrides = tuple(with_override(overrides, override_scope, override))
    proposed = replace(
        current,
        rules=rules if rules is not None else current.rules,
        overrides=overrides,
        tag=(-1, -1),
    )
    runtime.recorder.flush()
    return replay(runtime.store.latest_per_pod(), current, proposed, now=datetime.now(UTC))


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
