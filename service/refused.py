"""Selects refused for their token (401/403), counted per claimed cluster and reason.

A pod with a missing or mistyped token still boots: its agent answers from the seed
rules. Without this, a fleet with a wrong secret would quietly run the seed rules
everywhere, visible only in each pod's stderr. The hot path only bumps a counter in
memory; a background thread adds the counts to the store every few seconds, so every
replica's refusals add up on the dashboard (``GET /v1/refusals``: "7 refused selects
from prod-east in the last hour: missing bearer token") and in metrics. Claimed
cluster names are bounded like every other cluster label: an unauthenticated client
cannot grow the table or the metrics by inventing names.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from datetime import UTC, datetime

from mla_switchboard.service.messages import first_line
from mla_switchboard.service.metrics import OTHER_CLUSTERS, Metrics
from mla_switchboard.service.periodic import Periodic
from mla_switchboard.service.store import Store
from starlette.exceptions import HTTPException

log = logging.getLogger("switchboard.refused")

FLUSH_EVERY_S = 5.0

MISSING = "missing bearer token"
UNKNOWN = "unknown or revoked token"
ROLE = "token lacks the agent role"
SCOPE = "token limited to other clusters"


def reason_of(exc: HTTPException) -> str:
    """One of a few fixed reasons (a label and a dashboard line), from the refusal."""
    detail = exc.detail if isinstance(exc.detail, dict) else {}
    message = str(detail.get("message", ""))
    if exc.status_code == 401:
        return MISSING if message.startswith("missing") else UNKNOWN
    return SCOPE if "limited to clusters" in message else ROLE


class RefusedSelects:
    def __init__(self, store: Store, metrics: Metrics, max_clusters: int) -> None:
        self._store = store
        self._metrics = metrics
        self._max_clusters = max_clusters
        self._pending: Counter[tuple[str, str]] = Counter()
        self._seen: set[str] = set()  # claimed clusters this process counts by name
        self._lock = threading.Lock()
        self._thread = Periodic("refused-selects", FLUSH_EVERY_S, self.flush, log)

    def start(self) -> None:
        self._thread.start()

    def count(self, cluster: str, exc: HTTPException) -> None:
        """One refused select (the request path: a dict update and a counter)."""
        reason = reason_of(exc)
        with self._lock:
            if cluster not in self._seen:
                if len(self._seen) < self._max_clusters:
                    self._seen.add(cluster)
                else:
                    cluster = OTHER_CLUSTERS
            self._pending[(cluster, reason)] += 1
        self._metrics.refused_selects.labels(reason, cluster).inc()

    def flush(self) -> None:
        """Add what was counted since the last flush to the store (kept on failure)."""
        with self._lock:
            pending, self._pending = self._pending, Counter()
        if not pending:
            return
        try:
            self._store.refusals.add_refusals(pending, datetime.now(UTC))
        except Exception:
            with self._lock:
                self._pending.update(pending)
            raise

    def recent(self, since: datetime) -> list[tuple[str, str, int, datetime]]:
        self.flush()
        return self._store.refusals.refusals_since(since)

    def stop(self) -> None:
        self._thread.stop()
        try:
            self.flush()
        except Exception as exc:
            log.warning("refused selects not stored at shutdown: %s", first_line(exc))
