"""Everything one service process holds, built, started and stopped together: the
composition root. It wires each part to the collaborators it uses and holds no logic
of its own; nothing is handed the runtime.

The FastAPI app, the CLI (token commands, first-start bootstrap) and the tests all
build a ``Runtime`` from ``Settings``; nothing else opens the database.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path

from mla_switchboard.core.version import PROGRAM
from mla_switchboard.service.clusters import KnownClusters
from mla_switchboard.service.collector import Collector
from mla_switchboard.service.config import Settings
from mla_switchboard.service.deciding import Decider
from mla_switchboard.service.evidence.sync import EvidenceSync
from mla_switchboard.service.evidence.trust import TrustedEvidence
from mla_switchboard.service.fleet.expiry import PodExpiry
from mla_switchboard.service.fleet.groups import Fleet
from mla_switchboard.service.fleet.reads import FleetReads, ReadSettings
from mla_switchboard.service.gitops.drift import Drift
from mla_switchboard.service.gitops.planning import OverridesAsCode
from mla_switchboard.service.gitops.sync import FileSync
from mla_switchboard.service.guard_notes import GuardNotes
from mla_switchboard.service.identity.issuer_keys import IssuerKeys
from mla_switchboard.service.identity.key_health import IssuerKeysHealth
from mla_switchboard.service.identity.oidc import RelyingParty
from mla_switchboard.service.identity.people import People
from mla_switchboard.service.identity.throttle import FailureThrottle
from mla_switchboard.service.identity.workload import WorkloadVerifier
from mla_switchboard.service.inputs import InputsPublisher, index_factory
from mla_switchboard.service.live.events import EventHub
from mla_switchboard.service.live.poller import LiveConfig, fan_out
from mla_switchboard.service.messages import protect
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.reads.audit import AuditReads
from mla_switchboard.service.reads.health import Health
from mla_switchboard.service.reads.pods import PodReads
from mla_switchboard.service.reads.previews import Previews
from mla_switchboard.service.reads.selections import SelectionReads
from mla_switchboard.service.refused import RefusedSelects
from mla_switchboard.service.reports import Reports
from mla_switchboard.service.rollouts import RolloutGuards
from mla_switchboard.service.selector import Selector
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.db import make_engine, make_writer_engine, migrate
from mla_switchboard.service.store.deadline import store_deadline
from mla_switchboard.service.store.recorder import MIB, DecisionRecorder
from mla_switchboard.service.store.report_writes import ReportWriter
from mla_switchboard.service.writes.evidence import EvidenceWrites
from mla_switchboard.service.writes.flow import WriteFlow
from mla_switchboard.service.writes.managed import ManagedScopes
from mla_switchboard.service.writes.overrides import OverrideWrites
from mla_switchboard.service.writes.rules import RulesWrites
from mla_switchboard.service.writes.tokens import TokenWrites

log = logging.getLogger(PROGRAM)


SWITCH_INTERVAL_S = 0.001
"""The interpreter's switch interval while serving (``Runtime(serving=True)``): the
drainer gives the GIL up on every call into the database driver; while the event loop
is busy, taking it back waits up to the interval (5 ms by default) each time, which
stretched a batch's write under full load. 1 ms bounds that wait at a small cost."""


class Runtime:
    def __init__(self, settings: Settings, *, serving: bool = False) -> None:
        """``serving``: this process is ``switchboard serve``, and ``start`` may set the
        process-wide settings a server wants (the switch interval, the collector's
        freezing, ``service/collector.py``); ``stop`` restores them. An app built
        anywhere else (a test, another program) leaves the process as it found it."""
        self.settings = settings
        self.serving = serving
        self._switch_interval: float | None = None
        token = settings.admin_token.get_secret_value() if settings.admin_token else None
        protect(settings.database_url, token)  # no password in any log line or answer
        self.bootstrap_token = token
        # pods of clusters with a service-account issuer prove who they are (auth_workload)
        self.workload = WorkloadVerifier(
            settings.workload_issuers,
            leeway_s=settings.workload_leeway_s,
            keys_for=partial(IssuerKeys, refetch_s=settings.workload_refetch_s),
        )
        self.metrics = Metrics(settings.metrics_max_clusters)
        self.wrong_tokens = FailureThrottle(settings.auth_failures_per_minute, self.metrics)
        self.engine = make_engine(settings.database_url, deadline_s=settings.store_deadline_s)
        # the decision writer's own pool and shorter waits (a hung database holds it alone)
        self.writer_engine = make_writer_engine(settings.database_url, self.engine)
        # a request waits for each store call at most this long (store/deadline.py)
        self.store_deadline = store_deadline(self.engine, settings.store_deadline_s)
        self.store = Store(
            self.engine, decision_writer=self.writer_engine, deadline=self.store_deadline
        )
        self.fleet = Fleet(self.store.decisions, self.store.fleet)
        self.pod_expiry = PodExpiry(self.store.decisions, timedelta(days=settings.pod_ttl_days))
        self._unwatch_gc: Callable[[], None] | None = None
        self._build_inputs(settings)
        self.recorder = DecisionRecorder(
            self.store.decisions,
            self.metrics,
            interval_s=settings.flush_interval_s,
            batch=settings.flush_batch,
            budget_bytes=int(settings.buffer_limit_mb * MIB),
            limit=settings.buffer_limit,
            log_dir=settings.resolved_log_dir(),
            log_limit_bytes=int(settings.spill_limit_mb * MIB),
            shutdown_flush_s=settings.shutdown_flush_s,
            read_wait_s=settings.store_deadline_s,
        )
        self.selector = Selector(inputs_for=self.trusted.inputs_for)
        self.decider = Decider(self.selector, self.publisher.current, self.recorder, self.metrics)
        self.health = Health(
            self.live,
            self.recorder,
            self.evidence_sync,
            self.metrics,
            settings.max_config_staleness_s,
        )
        self._build_services(settings)
        keys = IssuerKeysHealth(self._issuer_keys).register(self.metrics.registry)
        self.health.sections.append(keys.readiness)

    def _build_inputs(self, settings: Settings) -> None:
        """What every decision reads: the configuration, the trusted evidence and the
        inputs published from both (``service/inputs.py``)."""
        # one per process: the cycle collector is the process's (service/collector.py)
        self.collector = Collector(freezes=self.serving)
        # measured selection trusts only some clusters' evidence (service/evidence/trust.py);
        # the indexes are kept up to date off the event loop (service/evidence/sync.py)
        self.trusted = TrustedEvidence(
            partial(index_factory, settings), on_change=lambda: self.publisher.evidence_changed()
        )
        self.publisher = InputsPublisher(self.trusted)
        self.known_clusters = KnownClusters(self.publisher.current, self.fleet)
        self.refused_selects = RefusedSelects(
            self.store.refusals,
            self.metrics,
            settings.metrics_max_clusters,
            known=self.known_clusters,
        )
        self.evidence_sync = EvidenceSync(
            self.store.config,
            self.store.measurements,
            self.trusted,
            max_age=timedelta(days=settings.measured_max_age_days),
            poll_s=settings.config_poll_s,
            on_change=self.publisher.evidence_changed,
            collector=self.collector,
            snapshots=self.store.snapshots,
        )
        # the consoles' change stream, fed by the same reads (service/live/events.py)
        self.events = EventHub(
            settings.event_ring, settings.event_streams_max, settings.event_heartbeat_s
        )
        self.live = LiveConfig(
            self.store.config,
            self.metrics,
            settings.config_poll_s,
            # other replicas' decisions (fleet_version) and evidence (evidence_version)
            on_versions=fan_out(
                self.fleet.notify, self.evidence_sync.notify, self.events.versions_read
            ),
            on_snapshot=fan_out(self.publisher.config_changed, self.events.config_changed),
        )

    def _issuer_keys(self) -> dict[str, IssuerKeys]:
        """Every token issuer's keys: the pods' issuers and the people's provider."""
        found = self.workload.all_keys()
        if self.relying_party is not None:
            found.update(self.relying_party.keys())
        return found

    def _build_services(self, settings: Settings) -> None:
        """The application services the routes call, each given what it uses."""
        store, current = self.store, self.publisher.current
        self.rollouts = RolloutGuards(
            store.config,
            self.live,
            self.trusted,
            current,
            self.evidence_sync.catch_up,
            self.metrics,
            GuardNotes(store.guard_pending),
            check_s=settings.rollout_check_s,
            askers=store.decisions.askers,
            static_sources=settings.guard_static_sources,
            decision_of=store.decisions.get_decision,
        )
        self.reads = FleetReads(
            self.fleet,
            self.recorder,
            self.trusted,
            current,
            ReadSettings(
                budget_s=settings.fleet_read_budget_s,
                min_samples=settings.measured_min_samples,
                min_pods=settings.measured_min_pods,
            ),
            self.collector,
            read_back=self.evidence_sync.read_back,
        )
        self.previews = Previews(self.reads)
        self.audit = AuditReads(store.audit)
        self.pods = PodReads(self.fleet, self.recorder, store.fleet, self.live, current)
        self.selections = SelectionReads(
            self.recorder, store.decisions, store.measurements, self.reads
        )
        flow = WriteFlow(self.live, store.recall_idempotency)
        managed = ManagedScopes()  # what a file synced in declarative mode owns
        self.override_writes = OverrideWrites(
            store.config, self.live, self.previews, flow, self.metrics, managed
        )
        self.rules_writes = RulesWrites(store.config, self.live, self.previews, flow, managed)
        self.overrides_as_code = OverridesAsCode(
            store.config, self.live, self.previews, flow, self.metrics, managed
        )
        self.drift = Drift(store.audit, self.live, self.metrics)
        self.file_sync: FileSync | None = None
        if settings.overrides_file:
            self.file_sync = FileSync(
                Path(settings.overrides_file),
                settings.overrides_file_prune,
                settings.overrides_file_poll_s,
                self.overrides_as_code,
                managed,
            )
        self.token_writes = TokenWrites(store.tokens, flow)
        # people sign in through the identity provider when one is configured
        self.relying_party = RelyingParty(settings) if settings.oidc_issuer else None
        self.people = People(
            store.sessions,
            settings.oidc_role_mapping,
            timedelta(hours=settings.session_hours),
            refresh_every=timedelta(seconds=settings.oidc_groups_refresh_s),
        )
        self.evidence_writes = EvidenceWrites(store.measurements, self.evidence_sync.catch_up, flow)
        # reports are stored in groups by one thread; an in-memory SQLite database is
        # written where it was opened (its one connection is that thread's)
        self.report_writer = ReportWriter(
            self.engine, self.evidence_sync.apply_local, inline=self.store_deadline is None
        )
        self.reports = Reports(
            store.measurements,
            store.decisions,
            self.recorder,
            self.evidence_sync,
            self.rollouts,
            self.report_writer,
            requires_identity=self.workload.requires_identity,
            deadline_s=None if self.store_deadline is None else settings.store_deadline_s,
        )

    def prepare_store(self) -> None:
        """Migrate and seed; safe to run from several replicas at once."""
        migrate(self.engine)
        self.store.config.ensure_seeded()

    def start(self) -> None:
        if self.settings.buffer_limit is not None:
            log.warning(
                "SWITCHBOARD_BUFFER_LIMIT is deprecated: memory for decisions is bounded in "
                "bytes by SWITCHBOARD_BUFFER_LIMIT_MB (%g); the count of %d applies as well",
                self.settings.buffer_limit_mb,
                self.settings.buffer_limit,
            )
        self.prepare_store()
        self.recorder.open()  # what the log holds past the mark, before any new decision
        self.live.start()
        self.evidence_sync.start()  # the first full load, before the first request
        self.recorder.start()
        self.rollouts.start()
        self.pod_expiry.start()
        self.refused_selects.start()
        if self.file_sync is not None:
            self.file_sync.start()  # the declarative mode's file, applied before any request
        self._unwatch_gc = self.metrics.watch_gc()
        if self.serving:
            self.collector.settle_at_start()  # service/collector.py
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL_S)

    def stop(self) -> None:
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None
        if self._unwatch_gc is not None:
            self._unwatch_gc()
            self._unwatch_gc = None
        if self.file_sync is not None:
            self.file_sync.stop()
        self.pod_expiry.stop()
        self.refused_selects.stop()
        self.rollouts.stop()
        self.recorder.stop()
        self.report_writer.stop()
        self.reads.close()
        self.evidence_sync.stop()
        self.live.stop()
        if self.store_deadline is not None:
            self.store_deadline.close()
        self.engine.dispose()
        self.writer_engine.dispose()
