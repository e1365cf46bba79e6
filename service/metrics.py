"""Prometheus metrics, one registry per app so several apps can live in one process
(the tests do that)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "switchboard_decisions_total",
            "Decisions answered by /v1/select",
            ["backend", "source", "cluster"],
            registry=r,
        )
        self.refusals = Counter(
            "switchboard_refusals_total", "Selections answered 409", ["kind"], registry=r
        )
        self.latency = Histogram(
            "switchboard_request_seconds",
            "HTTP request latency by route",
            ["method", "route", "status"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.rollout_changes = Counter(
            "switchboard_rollout_changes_total",
            "Staged overrides halted by a guard or promoted by a step, by the service itself",
            ["change"],
            registry=r,
        )
        self.override_writes = Counter(
            "switchboard_override_writes_total", "Override writes", ["action"], registry=r
        )
        self.store_errors = Counter(
            "switchboard_store_errors_total", "Failed database operations", ["op"], registry=r
        )
        self.decisions_written = Counter(
            "switchboard_decisions_written_total", "Decisions written to the store", registry=r
        )
        self.decisions_dropped = Counter(
            "switchboard_decisions_dropped_total",
            "Decisions dropped because the buffer was full while the store was down",
            registry=r,
        )
        self.buffered = Gauge(
            "switchboard_decisions_buffered", "Decisions waiting to be written", registry=r
        )
        self.store_degraded = Gauge(
            "switchboard_store_degraded", "1 while the database is unreachable", registry=r
        )
        self.config_version = Gauge(
            "switchboard_config_version", "Config version held in memory", registry=r
        )
