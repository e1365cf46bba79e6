"""``Store``: the per-resource stores on one engine; callers use the one they need."""

from __future__ import annotations

from typing import TypeVar

from mla_switchboard.service.store.audit import AuditStore
from mla_switchboard.service.store.base import Replayed, recall_idempotency
from mla_switchboard.service.store.config import ConfigStore
from mla_switchboard.service.store.deadline import StoreDeadline
from mla_switchboard.service.store.decisions import DecisionStore
from mla_switchboard.service.store.fleet import FleetStore
from mla_switchboard.service.store.guard_pending import GuardPendingStore
from mla_switchboard.service.store.measurements import MeasurementStore
from mla_switchboard.service.store.refusals import RefusalStore
from mla_switchboard.service.store.sessions import SessionStore
from mla_switchboard.service.store.snapshots import SnapshotStore
from mla_switchboard.service.store.tokens import TokenStore
from sqlalchemy import Engine

T = TypeVar("T")


class Store:
    """The per-resource stores on one engine (``store.config``, ``store.decisions``, ...):
    each service is handed the ones it uses."""

    def __init__(
        self,
        engine: Engine,
        decision_writer: Engine | None = None,
        deadline: StoreDeadline | None = None,
    ) -> None:
        """``decision_writer``: the engine the background writer's batches use
        (``db.make_writer_engine``), by default ``engine``. ``deadline``: how long a
        request waits for each store call (``store/deadline.py``); None, for ever."""
        self.engine = engine
        self.deadline = deadline
        if deadline is not None:
            deadline.watch(engine)
        bound = deadline.bound if deadline is not None else _as_is
        self.config = bound(ConfigStore(engine))
        self.tokens = bound(TokenStore(engine))
        self.audit = bound(AuditStore(engine))
        self.decisions = bound(DecisionStore(engine, writer=decision_writer))
        self.fleet = bound(FleetStore(engine))
        self.measurements = bound(MeasurementStore(engine))
        self.refusals = bound(RefusalStore(engine))
        self.sessions = bound(SessionStore(engine))
        self.guard_pending = bound(GuardPendingStore(engine))
        self.snapshots = bound(SnapshotStore(engine))

    def recall_idempotency(
        self, owner: str, key: str, request_hash: str | None = None
    ) -> Replayed | None:
        def recall() -> Replayed | None:
            return recall_idempotency(self.engine, owner, key, request_hash)

        return recall() if self.deadline is None else self.deadline.call(recall)


def _as_is(store: T) -> T:
    return store
