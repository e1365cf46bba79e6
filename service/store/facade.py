"""``Store``: one object for callers, each resource's queries in its own module."""

from __future__ import annotations

from mla_switchboard.service.store.audit import AuditStore
from mla_switchboard.service.store.base import Replayed, recall_idempotency
from mla_switchboard.service.store.config import ConfigStore
from mla_switchboard.service.store.decisions import DecisionStore
from mla_switchboard.service.store.fleet import FleetStore
from mla_switchboard.service.store.measurements import MeasurementStore
from mla_switchboard.service.store.refusals import RefusalStore
from mla_switchboard.service.store.tokens import TokenStore
from sqlalchemy import Engine


class Store:
    """The per-resource stores on one engine, with their methods under flat names."""

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

        c, t, d, m = self.config, self.tokens, self.decisions, self.measurements
        self.ensure_seeded = c.ensure_seeded
        self.config_version = c.config_version
        self.versions = c.versions
        self.load_config = c.load_config
        self.put_rules = c.put_rules
        self.get_override = c.get_override
        self.put_override = c.put_override
        self.update_rollout = c.update_rollout
        self.delete_override = c.delete_override
        self.create_token = t.create_token
        self.revoke_token = t.revoke_token
        self.count_tokens = t.count_tokens
        self.list_audit = self.audit.list_audit
        self.record_decisions = d.record_decisions
        self.record_rows = d.record_rows
        self.count_decisions = d.count_decisions
        self.list_decisions = d.list_decisions
        self.get_decision = d.get_decision
        self.latest_per_pod = d.latest_per_pod
        self.summary = self.fleet.summary
        self.fleet_groups = self.fleet.fleet_groups
        self.fleet_version = self.fleet.fleet_version
        self.shapes = self.fleet.shapes
        self.has_report = m.has_report
        self.add_measurements = m.add_measurements
        self.has_decision_for = m.has_decision_for
        self.record_failure = m.record_failure
        self.failures_for = m.failures_for
        self.evidence = m.evidence
        self.first_id = m.first_id
        self.measurement_rows = m.measurement_rows
        self.failure_rows = m.failure_rows
        self.clear_failures = m.clear_failures
        self.clear_rows = m.clear_rows
        self.last_clear_id = m.last_clear_id

    def recall_idempotency(
        self, owner: str, key: str, request_hash: str | None = None
    ) -> Replayed | None:
        return recall_idempotency(self.engine, owner, key, request_hash)
