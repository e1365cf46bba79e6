"""What this replica says of its own health: ``/readyz``'s answer, the store's state
and how old its view of the configuration is (also a gauge for ``/metrics``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mla_switchboard.service.evidence.sync import EvidenceSync
from mla_switchboard.service.live.poller import LiveConfig
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.recorder import DecisionRecorder
from prometheus_client import Gauge


@dataclass(eq=False)
class Health:
    """Registers its staleness gauge on ``metrics`` when made: one per replica."""

    live: LiveConfig
    recorder: DecisionRecorder
    evidence_sync: EvidenceSync
    metrics: Metrics
    max_config_staleness_s: float | None
    sections: list[Callable[[], dict[str, Any]]] = field(default_factory=list)
    """More of ``/readyz``'s body, told by the parts that know it (issuer keys)."""

    def __post_init__(self) -> None:
        Gauge(
            "switchboard_config_staleness_seconds",
            "Seconds since this replica last confirmed its configuration is current",
            registry=self.metrics.registry,
        ).set_function(lambda: self.config_age_s() or 0.0)

    def config_age_s(self) -> float | None:
        """How old this replica's view of the configuration is: seconds since it last
        confirmed with the store that its snapshot is current (None before the first)."""
        checked = self.live.checked_at
        return None if checked is None else time.monotonic() - checked

    def config_stale(self) -> bool:
        limit = self.max_config_staleness_s
        age = self.config_age_s()
        return limit is not None and age is not None and age > limit

    def degraded(self) -> str | None:
        return self.recorder.degraded or self.live.degraded or self.evidence_sync.degraded

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether this replica is ready (rules in memory, its view not too old), and
        the state it reports: the store's kind of error only, never a host or URL."""
        snap = self.live.snapshot
        degraded = self.degraded()
        age = self.config_age_s()
        stale = self.config_stale()
        ready = snap is not None and not stale
        recorder = self.recorder
        body: dict[str, Any] = {
            "status": "ready" if ready else "not ready",
            "rules_revision": None if snap is None else snap.rules.revision,
            "config_version": None if snap is None else snap.version,
            "config_age_s": None if age is None else round(age, 3),
            "max_config_staleness_s": self.max_config_staleness_s,
            "config_stale": stale,
            "store": "degraded" if degraded else "ok",
            "store_error": None if degraded is None else degraded.split(":", 1)[0],
            "decisions_buffered": recorder.pending,
            "decisions_buffered_bytes": recorder.buffered_bytes,
            **log_state(recorder.log_error),
            # what the start found missing from the log (a segment deleted, emptied or
            # damaged), with the count lost when it is known
            "log_damage": recorder.log_damage,
        }
        backlog = recorder.backlog()
        if backlog is not None and body["log"] == "ok":
            body["log"], body["log_error"] = "degraded", backlog
        body["log_backlog"] = backlog
        for section in self.sections:
            body.update(section())
        return ready, body

    def refresh_gauges(self) -> Metrics:
        """Set the gauges read at scrape time; the metrics to render."""
        m, recorder = self.metrics, self.recorder
        m.buffered.set(recorder.pending)
        m.buffered_bytes.set(recorder.buffered_bytes)
        m.log_bytes.set(recorder.log_bytes())
        m.log_degraded.set(0 if log_state(recorder.log_error)["log"] == "ok" else 1)
        m.store_degraded.set(1 if self.degraded() else 0)
        return m


def log_state(error: str | None) -> dict[str, str | None]:
    """The decision log's state for ``/readyz``: ``ok``, ``off`` (not configured) or
    ``degraded`` with the reason (an OS error's kind and text, or ``full``), never a
    path: while it is degraded, a crash loses the decisions not yet stored."""
    if error is None:
        return {"log": "ok", "log_error": None}
    if error.startswith("off"):
        return {"log": "off", "log_error": error}
    return {"log": "degraded", "log_error": error}
