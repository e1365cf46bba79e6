"""What every admin write shares: preview, If-Match handling, reload and metrics."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core.schemas import Override, RulesDocument
from mla_switchboard.service.api.deps import fail
from mla_switchboard.service.auth import Principal
from mla_switchboard.service.preview import Preview, replay, with_override
from mla_switchboard.service.runtime import Runtime
from mla_switchboard.service.state import Conflict


def preview_change(
    runtime: Runtime,
    *,
    rules: RulesDocument | None = None,
    override_scope: str | None = None,
    override: Override | None = None,
    visible: Callable[[str], bool] | None = None,
) -> Preview:
    """Replay the current fleet against the config with the proposed change applied.

    ``override_scope`` set with ``override=None`` previews deleting that override.
    ``visible``: which clusters' pods the caller may see (None: all).

    A replay reads and re-decides every pod's latest request (about 1 s of CPU with
    60,000 pods), so the answer is kept for ``SWITCHBOARD_PREVIEW_CACHE_S`` per
    (config version, proposal, caller's scope), and one replay runs at a time: a
    viewer looping on previews, or every admin write's preview, costs one replay per
    distinct change and config, not one per request (issue 13).
    """
    current = runtime.inputs
    key = _proposal_key(current.tag, rules, override_scope, override, visible)
    cache = _cache_of(runtime)
    ttl = runtime.settings.preview_cache_s
    hit = cache.get(key, ttl)
    if hit is not None:
        return hit
    with cache.computing:  # one replay at a time; a waiter may find it done
        hit = cache.get(key, ttl)
        if hit is not None:
            return hit
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
        pods = runtime.store.latest_per_pod()
        if visible is not None:
            pods = [p for p in pods if visible(p.cluster)]
        result = replay(
            pods, current, proposed, now=datetime.now(UTC), inputs_for=runtime.trusted.inputs_for
        )
        cache.put(key, result)
        return result


def cached_preview(
    runtime: Runtime,
    *,
    rules: RulesDocument | None = None,
    override_scope: str | None = None,
    override: Override | None = None,
    visible: Callable[[str], bool] | None = None,
) -> Preview | None:
    """The kept answer of ``preview_change`` for these arguments, if there is one: no
    I/O and little CPU, so the event loop may ask before handing a miss to a thread."""
    key = _proposal_key(runtime.inputs.tag, rules, override_scope, override, visible)
    return _cache_of(runtime).get(key, runtime.settings.preview_cache_s)


def _cache_of(runtime: Runtime) -> PreviewCache:
    cache = _CACHES.get(runtime)
    if cache is None:
        cache = _CACHES.setdefault(runtime, PreviewCache())
    return cache


class PreviewCache:
    SIZE = 256

    def __init__(self) -> None:
        self.computing = threading.Lock()
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Any, ...], tuple[float, Preview]] = OrderedDict()

    def get(self, key: tuple[Any, ...], ttl: float) -> Preview | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or time.monotonic() - entry[0] > ttl:
                return None
            return entry[1]

    def put(self, key: tuple[Any, ...], preview: Preview) -> None:
        with self._lock:
            self._entries[key] = (time.monotonic(), preview)
            self._entries.move_to_end(key)
            while len(self._entries) > self.SIZE:
                self._entries.popitem(last=False)


_CACHES: weakref.WeakKeyDictionary[Runtime, PreviewCache] = weakref.WeakKeyDictionary()


def _proposal_key(
    version: tuple[int, int],
    rules: RulesDocument | None,
    scope: str | None,
    override: Override | None,
    visible: Callable[[str], bool] | None,
) -> tuple[Any, ...]:
    proposal = {
        "rules": None if rules is None else rules.rules_only(),
        "scope": scope,
        "override": None
        if override is None
        else override.model_dump(mode="json", exclude={"created_at", "created_by", "revision"}),
    }
    digest = hashlib.sha256(json.dumps(proposal, sort_keys=True).encode()).hexdigest()
    # a bound method of the caller's principal: equal for equal principals
    owner = getattr(visible, "__self__", visible)
    return (version, digest, owner)


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
