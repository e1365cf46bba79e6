"""``Store``: the per-resource stores on one engine; callers use the one they need."""

from __future__ import annotations

from mla_switchboard.service.store.audit import AuditStore
from mla_switchboard.service.store.base import Replayed, recall_idempotency
from mla_switchboard.service.store.config import ConfigStore
from mla_switchboard.service.store.decisions import DecisionStore
from mla_switchboard.service.store.fleet import FleetStore
from mla_switchboard.service.store.guard_pending import GuardPendingStore
from mla_switchboard.service.store.measurements import MeasurementStore
from mla_switchboard.service.store.refusals import RefusalStore
from mla_switchboard.service.store.tokens import TokenStore
from sqlalchemy import Engine


class Store:
    """The per-resource stores on one engine (``store.config``, ``store.decisions``, ...):
    each service is handed the ones it uses."""

    def __init__(self, engine: Engine, decision_writer: Engine | None = None) -> None:
        """``decision_writer``: the engine the background writer's batches use
        (``db.make_writer_engine``), by default ``engine``."""
        self.engine = engine
        self.config = ConfigStore(engine)
        self.tokens = TokenStore(engine)
        self.audit = AuditStore(engine)
        self.decisions = DecisionStore(engine, writer=decision_writer)
        self.fleet = FleetStore(engine)
        self.measurements = MeasurementStore(engine)
        self.refusals = RefusalStore(engine)
        self.guard_pending = GuardPendingStore(engine)

    def recall_idempotency(
        self, owner: str, key: str, request_hash: str | None = None
    ) -> Replayed | None:
        return recall_idempotency(self.engine, owner, key, request_hash)
