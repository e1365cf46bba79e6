"""Everything one service process holds, started and stopped together.

The FastAPI app, the CLI (token commands, first-start bootstrap) and the tests all
build a ``Runtime`` from ``Settings``; nothing else opens the database.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from mla_switchboard.core.evaluator import DecisionInputs
from mla_switchboard.core.evidence import EvidenceIndex, FailurePolicy, Observation
from mla_switchboard.core.schemas import FLEET
from mla_switchboard.core.version import PROGRAM
from mla_switchboard.service.config import Settings
from mla_switchboard.service.evidence.sync import EvidenceSync
from mla_switchboard.service.evidence.trust import TrustedEvidence
from mla_switchboard.service.fleet.expiry import PodExpiry
from mla_switchboard.service.fleet.groups import Fleet
from mla_switchboard.service.fleet.reads import FleetReads
from mla_switchboard.service.live import LiveConfig
from mla_switchboard.service.messages import protect
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.refused import RefusedSelects
from mla_switchboard.service.reports import Reports
from mla_switchboard.service.rollouts import RolloutGuards
from mla_switchboard.service.selector import Selector
from mla_switchboard.service.state import ConfigSnapshot
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.db import make_engine, make_writer_engine, migrate
from mla_switchboard.service.store.recorder import MIB, DecisionRecorder
from mla_switchboard.service.writes import Writes
from prometheus_client import Gauge

log = logging.getLogger(PROGRAM)

YOUNG_GC_THRESHOLD = 10_000
"""Net new tracked objects before a young collection (CPython's default is 700): see
``Runtime.start``."""


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        token = settings.admin_token.get_secret_value() if settings.admin_token else None
        protect(settings.database_url, token)  # no password in any log line or answer
        self.metrics = Metrics(settings.metrics_max_clusters)
        self.engine = make_engine(settings.database_url)
        # the decision writer's own pool and shorter waits (a hung database holds it alone)
        self.writer_engine = make_writer_engine(settings.database_url, self.engine)
        self.store = Store(self.engine, decision_writer=self.writer_engine)
        self.fleet = Fleet(self.store)
        self.pod_expiry = PodExpiry(self.store, timedelta(days=settings.pod_ttl_days))
        self.refused_selects = RefusedSelects(
            self.store, self.metrics, settings.metrics_max_clusters, known=self.known_clusters
        )
        self._evidence_version = 0
        self._unwatch_gc: Callable[[], None] | None = None
        self._inputs_lock = threading.RLock()
        self._inputs: DecisionInputs | None = None
        # measured selection trusts only some clusters' evidence (service/evidence/trust.py);
        # the indexes are kept up to date off the event loop (service/evidence/sync.py)
        self.trusted = TrustedEvidence(self._new_index, on_change=self._evidence_changed)
        self.evidence_sync = EvidenceSync(
            self.store,
            self.trusted,
            max_age=timedelta(days=settings.measured_max_age_days),
            poll_s=settings.config_poll_s,
            on_change=self._evidence_changed,
        )
        self.live = LiveConfig(
            self.store,
            self.metrics,
            settings.config_poll_s,
            on_versions=self._versions_seen,
            on_snapshot=lambda _snap: self._publish(),
        )
        self.recorder = DecisionRecorder(
            self.store,
            self.metrics,
            interval_s=settings.flush_interval_s,
            batch=settings.flush_batch,
            budget_bytes=int(settings.buffer_limit_mb * MIB),
            limit=settings.buffer_limit,
            spill_path=settings.resolved_spill_path(),
            spill_limit_bytes=int(settings.spill_limit_mb * MIB),
            shutdown_flush_s=settings.shutdown_flush_s,
        )
        self.selector = Selector(inputs_for=self.trusted.inputs_for)
        Gauge(
            "switchboard_config_staleness_seconds",
            "Seconds since this replica last confirmed its configuration is current",
            registry=self.metrics.registry,
        ).set_function(lambda: self.config_age_s() or 0.0)
        self.rollouts = RolloutGuards(self, check_s=settings.rollout_check_s)
        self.reads = FleetReads(self)
        self.writes = Writes(self)
        self.reports = Reports(self)
        self.bootstrap_token = (
            settings.admin_token.get_secret_value() if settings.admin_token else None
        )

    def _versions_seen(self, versions: dict[str, int]) -> None:
        """What the config poller read of the store's counters: other replicas'
        decisions (``fleet_version``) and evidence (``evidence_version``, its epoch)."""
        self.fleet.saw(versions.get("fleet_version", 0))
        self.evidence_sync.notify(versions)

    def prepare_store(self) -> None:
        """Migrate and seed; safe to run from several replicas at once."""
        migrate(self.engine)
        self.store.ensure_seeded()

    def start(self) -> None:
        if self.settings.buffer_limit is not None:
            log.warning(
                "SWITCHBOARD_BUFFER_LIMIT is deprecated: memory for decisions is bounded in "
                "bytes by SWITCHBOARD_BUFFER_LIMIT_MB (%g); the count of %d applies as well",
                self.settings.buffer_limit_mb,
                self.settings.buffer_limit,
            )
        self.prepare_store()
        self.recorder.check_spill()  # reported by /readyz; the service answers anyway
        self.recorder.replay_spill()  # decisions a replica could not store, before any new
        self.live.start()
        self.evidence_sync.start()  # the first full load, before the first request
        self.recorder.start()
        self.rollouts.start()
        self.pod_expiry.start()
        self.refused_selects.start()
        # Everything loaded so far (modules, schemas, the snapshot) lives as long as the
        # process: take it out of the cycle collector's scans. Without this every
        # full collection under load walked ~120,000 startup objects on the event
        # loop's thread, tens of ms each on the 2-core machine (a p99 tail).
        gc.freeze()
        # A collection holds every thread, the event loop's with it. CPython collects the
        # young generation whenever tracked objects outnumber freed ones by 700; a fleet
        # read makes and frees thousands at a time, which set that off ~150 times a
        # second (3,100 collections in 20 s of back-to-back previews, 12 of them over
        # 10 ms on the loaded 2-core machine). At 10,000 what a read makes is freed by
        # reference counting before the count is reached: 2-3 collections in the same
        # 20 s, select p99 under previews 3.3-4.7 ms instead of 3.3-11.3 (idle 2.0-2.3);
        # cyclic garbage waits for at most 10,000 net new objects, a few MB.
        gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
        self._unwatch_gc = self.metrics.watch_gc()
        # The writer thread gives the GIL up on every call into the database driver;
        # while the event loop is busy, taking it back waits up to the switch interval
        # (5 ms by default) each time, which stretched a batch's write (and so what a
        # kill -9 loses) under full load. 1 ms bounds that wait at a small cost.
        sys.setswitchinterval(0.001)

    def stop(self) -> None:
        if self._unwatch_gc is not None:
            self._unwatch_gc()
            self._unwatch_gc = None
        self.pod_expiry.stop()
        self.refused_selects.stop()
        self.rollouts.stop()
        self.recorder.stop()
        self.reads.close()
        self.evidence_sync.stop()
        self.live.stop()
        self.engine.dispose()
        self.writer_engine.dispose()

    def _new_index(self) -> EvidenceIndex:
        s = self.settings
        return EvidenceIndex(
            min_samples=s.measured_min_samples,
            min_pods=s.measured_min_pods,
            failure_policy=FailurePolicy(
                min_pods=s.failure_min_pods, window=timedelta(hours=s.failure_window_hours)
            ),
            per_pod=s.measured_samples_per_pod,
        )

    def _publish(self, evidence_changed: bool = False) -> None:
        """Build the one ``DecisionInputs`` every decision reads and swap it in.

        Called whenever the config snapshot or the evidence changes; the hot path only
        ever reads ``self.inputs`` (one attribute), never a half-applied change. The
        evidence index of every trust scope the snapshot's overrides name is built
        here, before the snapshot is in force, so no decision has to build one. New
        evidence moves the evidence version (kept fleet reads follow it); decisions
        cached by the selector follow the evidence generation and, per situation, what
        they read."""
        with self._inputs_lock:
            snap = self.live.snapshot
            if snap is not None and self.trusted.ensure_scopes(snap.overrides):
                evidence_changed = True
            if evidence_changed:
                self._evidence_version += 1
            if snap is None:
                return
            self._inputs = DecisionInputs(
                rules=snap.rules,
                overrides=snap.overrides,
                evidence=self.trusted.all,
                tag=(snap.version, self._evidence_version),
                evidence_generation=self.trusted.generation,
            )

    def _evidence_changed(self) -> None:
        self._publish(evidence_changed=True)

    @property
    def inputs(self) -> DecisionInputs:
        inputs = self._inputs
        assert inputs is not None, "runtime not started"
        return inputs

    def known_clusters(self) -> frozenset[str]:
        """The cluster names this service knows: those with live pods, an override or a
        rule set of their own (reads the fleet's counts: not for the event loop)."""
        inputs = self.inputs
        names = {o.cluster for o in inputs.overrides if o.cluster != FLEET}
        names.update(inputs.rules.clusters)
        names.update(g.cluster for g in self.fleet.current().groups)
        return frozenset(names)

    def reload_evidence(self) -> bool:
        """Rebuild every evidence index from the store (the window only) and swap them
        in, waiting for it: for benchmarks and tests that need exactly the store's
        evidence now (the service itself reads increments and applies clears in place).
        It runs on the evidence thread, whose priority is below the event loop's. False:
        still running after a minute (it goes on in the background)."""
        return self.evidence_sync.reload()

    def add_evidence(self, observations: list[Observation]) -> None:
        """This replica's own new evidence (already stored), applied at once without a
        store read; other replicas read it from the store."""
        self.evidence_sync.apply_local(observations)

    @property
    def snapshot(self) -> ConfigSnapshot:
        snap = self.live.snapshot
        assert snap is not None, "runtime not started"
        return snap

    def config_age_s(self) -> float | None:
        """How old this replica's view of the configuration is: seconds since it last
        confirmed with the store that its snapshot is current (None before the first)."""
        checked = self.live.checked_at
        return None if checked is None else time.monotonic() - checked

    def config_stale(self) -> bool:
        limit = self.settings.max_config_staleness_s
        age = self.config_age_s()
        return limit is not None and age is not None and age > limit

    def degraded(self) -> str | None:
        return self.recorder.degraded or self.live.degraded or self.evidence_sync.degraded
