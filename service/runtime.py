"""Everything one service process holds, started and stopped together.

The FastAPI app, the CLI (token commands, first-start bootstrap) and the tests all
build a ``Runtime`` from ``Settings``; nothing else opens the database.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from mla_switchboard.core.evidence import EvidenceIndex, Observation
from mla_switchboard.service.config import Settings
from mla_switchboard.service.live import LiveConfig
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.selector import Selector
from mla_switchboard.service.store.db import make_engine, migrate
from mla_switchboard.service.store.recorder import DecisionRecorder
from mla_switchboard.service.store.repo import ConfigSnapshot, Store

log = logging.getLogger("switchboard")


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.engine = make_engine(settings.database_url)
        self.store = Store(self.engine)
        self.evidence = EvidenceIndex(
            [], min_samples=settings.measured_min_samples, min_pods=settings.measured_min_pods
        )
        self.evidence_version = 0
        self.live = LiveConfig(
            self.store, self.metrics, settings.config_poll_s, on_evidence=self.reload_evidence
        )
        self.recorder = DecisionRecorder(
            self.store,
            self.metrics,
            interval_s=settings.flush_interval_s,
            batch=settings.flush_batch,
            limit=settings.buffer_limit,
        )
        self.selector = Selector(
            ranker=lambda request, reasons: self.evidence.rank(request, reasons),
            evidence_version=lambda: self.evidence_version,
        )
        self.bootstrap_token = (
            settings.admin_token.get_secret_value() if settings.admin_token else None
        )

    def prepare_store(self) -> None:
        """Migrate and seed; safe to run from several replicas at once."""
        migrate(self.engine)
        self.store.ensure_seeded()

    def start(self) -> None:
        self.prepare_store()
        self.live.start()
        self.recorder.start()

    def stop(self) -> None:
        self.recorder.stop()
        self.live.stop()
        self.engine.dispose()

    def reload_evidence(self) -> None:
        """Rebuild the measured-selection index from the store (last N days only)."""
        since = datetime.now(UTC) - timedelta(days=self.settings.measured_max_age_days)
        self.evidence = EvidenceIndex(
            self.store.evidence(since),
            min_samples=self.settings.measured_min_samples,
            min_pods=self.settings.measured_min_pods,
        )
        self.evidence_version += 1

    def add_evidence(self, observations: list[Observation]) -> None:
        """This replica's own new evidence, applied at once without a store read."""
        self.evidence.add(observations)
        self.evidence_version += 1

    @property
    def snapshot(self) -> ConfigSnapshot:
        snap = self.live.snapshot
        assert snap is not None, "runtime not started"
        return snap

    def degraded(self) -> str | None:
        return self.recorder.degraded or self.live.degraded
