"""Selects refused for their token (401/403/429), counted per claimed cluster and reason.

A pod with a missing or mistyped token still boots: its agent answers from the seed
rules. Without this, a fleet with a wrong secret would quietly run the seed rules
everywhere, visible only in each pod's stderr. The hot path only bumps a counter in
memory; a background thread adds the counts to the store every few seconds, so every
replica's refusals add up on the dashboard (``GET /v1/refusals``: "7 refused selects
from prod-east in the last hour: missing bearer token") and in metrics.

The cluster a refused select claims is not authenticated, so its name is bounded in a
way invented names cannot crowd real ones out of: clusters the service knows (with
recorded pods, an override or a rule set of their own) are counted by name, up to
``max_clusters`` an hour, further ones as ``(other)``; any other name is counted by name
only within a small budget an hour (a new cluster whose every select is refused is
unknown too, and should still show), beyond it as ``(unknown cluster)``. Both budgets
start again each hour, the store's own unit, so one burst of junk names hides no
cluster for longer. Metrics name known clusters only: an unknown name is always
``(unknown cluster)`` there, so no caller can grow ``/metrics`` with names.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Collection
from datetime import UTC, datetime

from mla_switchboard.service.messages import first_line
from mla_switchboard.service.metrics import OTHER_CLUSTERS, Metrics
from mla_switchboard.service.periodic import Periodic
from mla_switchboard.service.store.refusals import RefusalStore
from mla_switchboard.service.store.rows import RefusalCount
from starlette.exceptions import HTTPException

log = logging.getLogger("switchboard.refused")

FLUSH_EVERY_S = 5.0
UNKNOWN_CLUSTER = "(unknown cluster)"  # a name no cluster can have, like "(other)"
UNKNOWN_NAMES_PER_HOUR = 20

MISSING = "missing bearer token"
UNKNOWN = "unknown or revoked token"
ROLE = "token lacks the agent role"
SCOPE = "token limited to other clusters"
WORKLOAD = "workload token rejected"
IDENTITY = "not the workload token's pod or cluster"
STATIC = "static token in a workload-identity cluster"


def reason_of(exc: HTTPException) -> str:
    """One of a few fixed reasons (a label and a dashboard line), from the refusal."""
    detail = exc.detail if isinstance(exc.detail, dict) else {}
    message = str(detail.get("message", ""))
    if exc.status_code in (401, 429):  # 429: a wrong token, from an address sending many
        if message.startswith("missing"):
            return MISSING
        if "requires workload identity" in message:
            return STATIC
        return WORKLOAD if message.startswith("workload token") else UNKNOWN
    if exc.status_code == 503:
        return WORKLOAD  # the issuer's keys could not be had
    if detail.get("field") in ("pod", "cluster"):
        return IDENTITY
    return SCOPE if "limited to clusters" in message else ROLE


class RefusedSelects:
    def __init__(
        self,
        refusals: RefusalStore,
        metrics: Metrics,
        max_clusters: int,
        known: Callable[[], Collection[str]] = frozenset,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """``known``: the cluster names the service knows now (may read the store: it
        is called from the background thread only); ``clock``: the hour budgets' time."""
        self._refusals = refusals
        self._metrics = metrics
        self._max_clusters = max_clusters
        self._unknown_names = min(max_clusters, UNKNOWN_NAMES_PER_HOUR)
        self._known_source = known
        self._known: frozenset[str] = frozenset()
        self._stale_known = True  # an unknown name came in: read ``known`` again
        self._clock = clock
        self._hour: datetime | None = None
        self._named: set[str] = set()  # known clusters counted by name this hour
        self._unknown: set[str] = set()  # other names counted by name this hour
        self._pending: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._thread = Periodic("refused-selects", FLUSH_EVERY_S, self.flush, log)

    def start(self) -> None:
        try:
            self.refresh_known()
        except Exception as exc:  # read again with the first unknown name
            log.warning("known clusters not read at start: %s", first_line(exc))
        self._thread.start()

    def refresh_known(self) -> None:
        """Read which clusters the service knows (off the event loop)."""
        self._stale_known = False
        try:
            known = frozenset(self._known_source())
        except Exception:
            self._stale_known = True
            raise
        with self._lock:
            self._known = known
            self._unknown -= known  # counted as unknown before: its place is free again

    def count(self, cluster: str, exc: HTTPException) -> None:
        """One refused select (the request path: a set lookup and a counter)."""
        reason = reason_of(exc)
        with self._lock:
            stored, metric = self._labels(cluster)
            self._pending[(stored, reason)] += 1
        self._metrics.refused_selects.labels(reason, metric).inc()

    def _labels(self, cluster: str) -> tuple[str, str]:
        """The names ``cluster`` is counted under in the store and in metrics."""
        hour = self._clock().replace(minute=0, second=0, microsecond=0)
        if hour != self._hour:
            self._hour = hour
            self._named.clear()
            self._unknown.clear()
        if cluster in self._known:
            if cluster in self._named or len(self._named) < self._max_clusters:
                self._named.add(cluster)
                return cluster, cluster
            return OTHER_CLUSTERS, OTHER_CLUSTERS
        self._stale_known = True  # it may have become known since the last read
        if cluster in self._unknown or len(self._unknown) < self._unknown_names:
            self._unknown.add(cluster)
            return cluster, UNKNOWN_CLUSTER
        return UNKNOWN_CLUSTER, UNKNOWN_CLUSTER

    def flush(self) -> None:
        """Add what was counted since the last flush to the store (kept on failure),
        and read the known clusters again when an unknown name came in."""
        with self._lock:
            pending, self._pending = self._pending, Counter()
        if pending:
            try:
                self._refusals.add_refusals(pending, datetime.now(UTC))
            except Exception:
                with self._lock:
                    self._pending.update(pending)
                raise
        if self._stale_known:
            self.refresh_known()

    def recent(self, since: datetime) -> list[RefusalCount]:
        self.flush()
        return self._refusals.refusals_since(since)

    def stop(self) -> None:
        self._thread.stop()
        try:
            self.flush()
        except Exception as exc:
            log.warning("refused selects not stored at shutdown: %s", first_line(exc))
