"""Prometheus metrics, one registry per app so several apps can live in one process
(the tests do that).

Bounded, and private where it names clusters: otherwise any agent could grow
``/metrics`` with new cluster names (40,000 names make it 8.5 MB and 0.95 s of event
loop per scrape), and it would list every cluster to anyone. So

- the ``cluster`` label takes at most ``max_clusters`` distinct values per process;
  decisions of further clusters are counted under ``cluster="(other)"`` (a name no
  cluster can have);
- :func:`render` is called off the event loop, and shows cluster labels only to a
  caller with a viewer token, and of those only the clusters its scope allows; anyone
  else gets the same counters summed over clusters.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

OTHER_CLUSTERS = "(other)"


class Children:
    """A labelled metric's children by label values, for label values drawn from a
    small bounded set (statuses, refusal kinds, route templates).

    ``.labels()`` checks its arguments, builds a tuple and takes a lock on every call;
    the request path asks for the same few children thousands of times a second.
    """

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class BoundedClusterCounter:
    """A ``Counter`` whose ``cluster`` label (the last one) admits ``limit`` values."""

    def __init__(self, counter: Counter, limit: int) -> None:
        self._counter = counter
        self._limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        # children of admitted clusters and of (other), by the labels asked for: at
        # most (limit + 1) x the other labels' few values; a cluster refused admission
        # is looked up under (other), so no caller can grow this
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is not None:
            return child
        *rest, cluster = values
        if cluster not in self._seen:
            with self._lock:
                if len(self._seen) < self._limit:
                    self._seen.add(cluster)
                else:
                    cluster = OTHER_CLUSTERS
        key = (*rest, cluster)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._counter.labels(*key)
        return child


class Metrics:
    """Every metric the service exports, registered in one order (the scrape's order)."""

    def __init__(self, max_clusters: int = 200) -> None:
        self.registry = CollectorRegistry()
        self._add_select_metrics(max_clusters)
        self._add_latency_metrics()
        self._add_write_metrics()
        self._add_connection_metrics()

    def _counter(self, name: str, documentation: str, labels: Iterable[str] = ()) -> Counter:
        return Counter(name, documentation, labels, registry=self.registry)

    def _gauge(self, name: str, documentation: str) -> Gauge:
        return Gauge(name, documentation, registry=self.registry)

    def _add_select_metrics(self, max_clusters: int) -> None:
        self.refused_selects = BoundedClusterCounter(
            self._counter(
                "switchboard_refused_selects_total",
                "Selects refused for their token (401/403), by reason and claimed cluster: "
                "pods with a missing or mistyped token show here",
                ["reason", "cluster"],
            ),
            max_clusters,
        )
        self.decisions = BoundedClusterCounter(
            self._counter(
                "switchboard_decisions_total",
                "Decisions answered by /v1/select",
                ["backend", "source", "cluster"],
            ),
            max_clusters,
        )
        self.refusals = self._counter(
            "switchboard_refusals_total", "Selections answered 409", ["kind"]
        )
        self.auth_failures = self._counter(
            "switchboard_auth_failures_total",
            "Requests with a wrong bearer token (unknown, revoked or malformed; a missing "
            "one is not counted), by outcome: rejected (401) or throttled (429, the client "
            "address sent SWITCHBOARD_AUTH_FAILURES_PER_MINUTE wrong tokens in its window)",
            ["outcome"],
        )

    def _add_latency_metrics(self) -> None:
        r = self.registry
        self.loop_lag = Histogram(
            "switchboard_event_loop_lag_seconds",
            "How late the event loop ran a timer set every 50 ms: what any request waited "
            "beyond its own work while something held the loop",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.gc_pause = Histogram(
            "switchboard_gc_pause_seconds",
            "How long each cyclic garbage collection held the process (every thread, the "
            "event loop's too), by generation: a loop stall that matches one of these is "
            "the collector's",
            ["generation"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
            registry=r,
        )
        self.latency = Histogram(
            "switchboard_request_seconds",
            "HTTP request latency by route",
            ["method", "route", "status"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.latency_of = Children(self.latency)  # (method, route, status) -> child
        self.refusals_of = Children(self.refusals)  # kind -> child

    def _add_write_metrics(self) -> None:
        """Rollout and override writes, and the decision recorder's memory and log."""
        self.rollout_changes = self._counter(
            "switchboard_rollout_changes_total",
            "Staged overrides halted by a guard or promoted by a step, by the service itself",
            ["change"],
        )
        self.override_writes = self._counter(
            "switchboard_override_writes_total", "Override writes", ["action"]
        )
        self.store_errors = self._counter(
            "switchboard_store_errors_total", "Failed database operations", ["op"]
        )
        self.decisions_written = self._counter(
            "switchboard_decisions_written_total", "Decisions written to the store"
        )
        self.decisions_dropped = self._counter(
            "switchboard_decisions_dropped_total",
            "Decisions refused (their answer said recorded: false) or lost at shutdown: "
            "memory was at SWITCHBOARD_BUFFER_LIMIT_MB and the decision log could not take "
            "them (full, not writable, or off)",
        )
        self.buffered = self._gauge(
            "switchboard_decisions_buffered", "Decisions in memory waiting to be written"
        )
        self.buffered_bytes = self._gauge(
            "switchboard_decisions_buffered_bytes",
            "Estimated memory held by the decisions waiting to be written",
        )
        self.log_bytes = self._gauge(
            "switchboard_decision_log_bytes",
            "Size of the decision log's segments (decisions stored or not yet)",
        )
        self.log_degraded = self._gauge(
            "switchboard_decision_log_degraded",
            "1 while the decision log cannot take decisions (not writable, full, or off)",
        )
        self.store_degraded = self._gauge(
            "switchboard_store_degraded", "1 while the database is unreachable"
        )

    def _add_connection_metrics(self) -> None:
        self.connections_closed = self._counter(
            "switchboard_connections_closed_total",
            "Connections the server closed before answering: header_size (431), "
            "header_timeout and body_timeout (408), evicted (its place taken at the "
            "connection limit) and refused (503, at the limit with every connection busy)",
            ["reason"],
        )
        self.client_disconnects = self._counter(
            "switchboard_client_disconnects_total",
            "Requests whose client closed the connection before the answer",
        )
        self.connections_open = self._gauge("switchboard_connections_open", "Open HTTP connections")
        self.config_version = self._gauge(
            "switchboard_config_version", "Config version held in memory"
        )

    def watch_gc(self) -> Callable[[], None]:
        """Time every collection from now on; returns the function that stops it.

        ``gc.callbacks`` is process-wide and runs on whichever thread triggered the
        collection, so the start time is kept per thread."""
        children = [self.gc_pause.labels(str(g)) for g in range(3)]
        began = threading.local()

        def timed(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                began.at = time.perf_counter()
            elif (at := getattr(began, "at", None)) is not None:
                children[info["generation"]].observe(time.perf_counter() - at)
                began.at = None

        gc.callbacks.append(timed)

        def stop() -> None:
            if timed in gc.callbacks:
                gc.callbacks.remove(timed)

        return stop

    def render(self, clusters: Callable[[str], bool] | None) -> bytes:
        """The text exposition. ``clusters``: which cluster labels the caller may see
        (None: none, every family with a cluster label is summed over it)."""
        return generate_latest(_Scoped(self.registry, clusters))  # type: ignore[arg-type]


class _Scoped:
    """A registry view: cluster labels kept where ``allowed`` says so, else summed."""

    def __init__(self, registry: CollectorRegistry, allowed: Callable[[str], bool] | None):
        self._registry = registry
        self._allowed = allowed

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            if not any("cluster" in s.labels for s in family.samples):
                yield family
                continue
            out = Metric(family.name, family.documentation, family.type, family.unit)
            summed: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for s in family.samples:
                if self._allowed is None and s.name.endswith("_created"):
                    continue  # a creation time summed over clusters means nothing
                labels = dict(s.labels)
                cluster = labels.pop("cluster", None)
                if self._allowed is not None and cluster is not None:
                    if not self._allowed(cluster):
                        continue
                    labels["cluster"] = cluster
                key = (s.name, tuple(sorted(labels.items())))
                summed[key] = summed.get(key, 0.0) + s.value
            for (name, labels_items), value in summed.items():
                out.add_sample(name, dict(labels_items), value)
            yield out
