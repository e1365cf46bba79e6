"""Everything one service process holds, started and stopped together.

The FastAPI app, the CLI (token commands, first-start bootstrap) and the tests all
build a ``Runtime`` from ``Settings``; nothing else opens the database.
"""

from __future__ import annotations

import logging

from service.config import Settings
from service.live import LiveConfig
from service.metrics import Metrics
from service.selector import Selector
from service.store.db import make_engine, migrate
from service.store.recorder import DecisionRecorder
from service.store.repo import ConfigSnapshot, Store

log = logging.getLogger("switchboard")


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.engine = make_engine(settings.database_url)
        self.store = Store(self.engine)
        self.live = LiveConfig(self.store, self.metrics, settings.config_poll_s)
        self.recorder = DecisionRecorder(
            self.store,
            self.metrics,
            interval_s=settings.flush_interval_s,
            batch=settings.flush_batch,
            limit=settings.buffer_limit,
        )
        self.selector = Selector()
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

    @property
    def snapshot(self) -> ConfigSnapshot:
        snap = self.live.snapshot
        assert snap is not None, "runtime not started"
        return snap

    def degraded(self) -> str | None:
        return self.recorder.degraded or self.live.degraded
