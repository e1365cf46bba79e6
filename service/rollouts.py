"""Guarded rollouts, run by the service: the guards that halt a staged override and the
steps that promote it.

The rules are the core's (``core/rollouts.py``: steps and the speed guard; the
evaluator's ``in_stage``: who is in the stage); this module feeds them the service's
signals and writes the outcome through the store, audited with the service itself as
actor. A halt or promotion bumps the configuration version, so every replica applies
it within its poll interval (0.5 s by default), this one at once.

What the guards count is evidence sources, not pod names from a body: each report is
about a decision, and each decision keeps who asked for it (``core.rollouts.
evidence_source``: a verified pod once per UID, a static token once per pod name it
recorded a decision for, or once in all with ``SWITCHBOARD_GUARD_STATIC_SOURCES=
per_token``). ``max_failures`` and the speed guard's two pods are distinct sources, and a
rollout shows how many of them were verified (``Rollout.evidence``).

A guard runs after the report that triggers it is stored. When the database fails in
between (the guard's own write, or a read it needs), the report stays stored and is
answered as such, with ``"guard": "pending"``: the evaluation is kept and tried again
by this replica's periodic check before it promotes any step, so a halt is late rather
than lost. Each report a guard counts (in the stage of an active rollout whose guards
take its cluster) has its evaluation also noted in the database before the report is
stored (``guard_pending``) and removed once it ran:
every replica's step waits while one is noted, and one left by its replica past
``GuardNotes.grace_s`` is run by whichever replica checks next, so another replica that
reaches the database cannot promote past a halt this one could not write. An
evaluation that fails again for
a reason a retry does not fix (not a lost connection) is dropped with an error logged,
so that one bad report cannot hold every later promotion back. An agent that retries
a measurement report (the same ``report_id``) gets the guard evaluated again too,
which covers a replica that died with a pending one.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal

from mla_switchboard.core import cause_words as words
from mla_switchboard.core import rollouts
from mla_switchboard.core.causes import FailureHalt, PodAt, PodError, SlowdownHalt
from mla_switchboard.core.causes import first_line as error_line
from mla_switchboard.core.evaluator import (
    Decision,
    DecisionInputs,
    applicable_overrides,
    decide,
    in_stage,
)
from mla_switchboard.core.evidence import PodSample, Situation, situation_of
from mla_switchboard.core.names import cluster_matches
from mla_switchboard.core.schemas import MeasurementReport, Override, Rollout
from mla_switchboard.core.stages import stage_buckets
from mla_switchboard.core.version import PROGRAM
from mla_switchboard.service.evidence.trust import TrustedEvidence
from mla_switchboard.service.guard_notes import (
    STORE_ERRORS,
    TRANSIENT_ERRORS,
    GuardNotes,
    Unknown,
    failure_guarded,
    failure_key,
    measurements_guarded,
    measurements_key,
    measurements_note,
    report_request,
    staged_rollouts,
)
from mla_switchboard.service.live.poller import LiveConfig
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.periodic import Periodic
from mla_switchboard.service.state import DecisionRecord
from mla_switchboard.service.store.config import ConfigStore
from mla_switchboard.service.store.guard_pending import Note
from mla_switchboard.service.store.rows import PendingGuard
from prometheus_client import Gauge
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("switchboard.rollouts")

SERVICE_ACTOR = PROGRAM
"""The audit log's actor for what the service does by itself."""

GuardOutcome = Literal["checked", "pending"]
"""What a report's answer says of the guards: evaluated, or deferred (database error)."""

MAX_PENDING = 10_000
"""Most guard evaluations kept for a retry; past it the oldest is dropped (and logged):
while the database is away every report would otherwise add one, without bound."""


@dataclass(eq=False)
class RolloutGuards:
    """Halts staged overrides on failures or slowdowns; promotes them step by step.

    ``inputs``: the decision inputs in force; ``catch_up``: read every report the
    store holds now (``EvidenceSync.catch_up``)."""

    config: ConfigStore
    live: LiveConfig
    trusted: TrustedEvidence
    inputs: Callable[[], DecisionInputs]
    catch_up: Callable[[], object]
    metrics: Metrics
    notes: GuardNotes
    """Evaluations noted in the database before their report is stored, so that no
    replica's step overtakes one this replica could not run."""
    check_s: float = 1.0
    askers: Callable[[str, Sequence[str]], dict[str, tuple[str | None, bool]]] = (
        lambda cluster, pods: {}
    )
    """Who asked for each of a cluster's pods' newest decision (principal id, verified):
    ``DecisionStore.askers``. Unknown pods count under their name."""
    static_sources: rollouts.StaticSources = "per_pod"
    """How a static token's reports count (``core.rollouts.evidence_source``)."""
    decision_of: Callable[[str], DecisionRecord | None] = lambda decision_id: None
    """A stored decision by id (``DecisionStore.get_decision``): what a noted failure
    is evaluated from on another replica."""
    _pending: dict[tuple[str, ...], Callable[[], None]] = field(
        init=False, default_factory=dict
    )  # oldest first
    _pending_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _thread: Periodic = field(init=False)

    def __post_init__(self) -> None:
        self._thread = Periodic("rollout-steps", self.check_s, self.check, log)
        Gauge(
            "switchboard_rollout_guards_pending",
            "Guard evaluations deferred by a database error, retried every rollout check",
            registry=self.metrics.registry,
        ).set_function(lambda: len(self._pending))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    # ------------------------------------------------- reports, noted then stored

    def expect_failure(self, record: DecisionRecord, backend: str, error: str) -> bool:
        """Note in the database, before the failure is stored, that its guard is to run
        (``service/guard_notes.py``), when a guard counts it; whether it was noted."""
        if not failure_guarded(record, backend):
            return False
        self.notes.expect_failure(record.id, backend, error)
        return True

    def measurements_note(self, report: MeasurementReport, report_id: str) -> Note | None:
        """The note a measurement report's evaluation needs, stored with the report
        when it counts; None when no guard counts it (nothing to note)."""
        if not measurements_guarded(report, self.inputs(), datetime.now(UTC)):
            return None
        return measurements_note(report, report_id)

    def failure_reported(
        self, record: DecisionRecord, backend: str, error: str, *, noted: bool = True
    ) -> GuardOutcome:
        """Run the failure guard for a failure report the store holds already (made by
        the decision's own asker: ``Reports.failure`` checks it); ``noted``: whether
        ``expect_failure`` noted it (only a note taken is removed)."""
        key = failure_key(record.id, backend)

        def run() -> None:
            self.on_failure(record, backend, error)
            if noted:
                self.notes.done(key)

        return self._evaluate(("failure", record.id, backend), run)

    def measurements_reported(
        self, report: MeasurementReport, report_id: str, *, noted: bool = True
    ) -> GuardOutcome:
        """Run the speed guard for a counted measurement report the store holds already.
        ``noted``: whether a guard counted it when it was stored (its note stored with
        it); one no guard counted has nothing to evaluate (a rollout that starts later
        reads its stage's samples whole at its next report)."""
        if not noted:
            return "checked"

        def run() -> None:
            self.on_measurements(report)
            self.notes.done(measurements_key(report_id))

        return self._evaluate(("measurements", report_id), run)

    def measurements_retried(self, report: MeasurementReport, report_id: str) -> GuardOutcome:
        """A report stored before (its ``report_id``) came again: the first attempt's
        guard may never have run (its replica died after the commit), so run it again,
        once this replica has read every stored report (the first attempt may have
        reached another replica). The guard is idempotent: it compares stored samples
        and halts a rollout at most once."""

        def again() -> None:
            self.catch_up()
            self.on_measurements(report)
            self.notes.done(measurements_key(report_id))

        return self._evaluate(("measurements", report_id), again)

    def check(self, now: datetime | None = None) -> None:
        """The periodic round: guard evaluations a database error deferred first (this
        replica's, then those noted in the database by any replica), then the steps.
        A step waits for the evaluations of reports noted before it came due (a
        promotion starts a new stage, in which the failure such an evaluation counts
        would be "from before the stage"), never for those noted after: a steady
        stream of reports cannot hold a step back beyond its interval."""
        if not self.retry_pending():
            return
        oldest = self.retry_noted()
        if not isinstance(oldest, Unknown):
            self.promote_due(now, oldest_note=oldest)

    def retry_noted(self) -> datetime | Unknown | None:
        """Run the evaluations noted in the database that their replica left (it lost
        the database, or died); when the oldest still noted was taken
        (``GuardNotes.run_left``)."""
        return self.notes.run_left(self._noted_run)

    def _noted_run(self, item: PendingGuard) -> Callable[[], None]:
        """The evaluation a noted row stands for, as the replica that noted it runs it."""
        data = json.loads(item.payload)
        if item.kind == "failure":
            record = self.decision_of(data["decision_id"])

            def failure() -> None:
                if record is not None:
                    self.on_failure(record, data["backend"], data["error"])

            return failure
        report = MeasurementReport.model_validate(data["report"])

        def measurements() -> None:
            self.catch_up()  # the report reached another replica: read what is stored
            self.on_measurements(report)

        return measurements

    def retry_pending(self) -> bool:
        """Evaluate the deferred guards again, oldest first; True when none is left.
        The first that loses the database again ends the round (it is still away); one
        that fails otherwise is dropped and logged: retrying would fail the same way."""
        with self._pending_lock:
            waiting = list(self._pending.items())
        for key, run in waiting:
            try:
                run()
            except TRANSIENT_ERRORS as exc:
                log.warning(
                    "%d rollout guard evaluation(s) still pending: %s",
                    len(self._pending),
                    first_line(exc),
                )
                return False
            except Exception:
                log.exception("rollout guard evaluation %s dropped: it cannot succeed", key)
            with self._pending_lock:
                if self._pending.get(key) is run:
                    del self._pending[key]
        if waiting:
            log.warning("deferred rollout guard evaluations done: %d", len(waiting))
        return not self._pending

    def _evaluate(self, key: tuple[str, ...], run: Callable[[], None]) -> GuardOutcome:
        try:
            run()
        except STORE_ERRORS as exc:
            with self._pending_lock:
                self._pending.pop(key, None)
                self._pending[key] = run
                dropped = 0
                while len(self._pending) > MAX_PENDING:
                    del self._pending[next(iter(self._pending))]
                    dropped += 1
            log.warning(
                "rollout guard not evaluated (%s): the report is stored; retried every %g s",
                first_line(exc),
                self.check_s,
            )
            if dropped:
                log.error("rollout guard evaluations dropped: more than %d pending", MAX_PENDING)
            return "pending"
        return "checked"

    # ----------------------------------------------------------------- guards

    def on_failure(self, record: DecisionRecord, backend: str, error: str) -> None:
        """A pod reported that the backend it was given failed. If an active rollout put
        it there, in a cluster whose pods may halt it, and the decision was made in the
        current stage (not before the last resume or step), its evidence source counts
        once (``core.rollouts.evidence_source``: a verified pod per UID, a static token
        per pod name it asked a decision for, or once with ``per_token``); at
        ``max_failures`` distinct sources the rollout halts. A source reporting again, or
        an old decision's failure, can never halt a rollout."""
        staged = staged_rollouts(record, backend)
        if not staged:
            return
        line = error_line(error)
        where = f"{record.cluster}/{record.pod or '?'}"
        source = rollouts.evidence_source(
            record.principal, record.verified, record.cluster, record.pod, self.static_sources
        )
        failure = PodError(cluster=record.cluster, pod=record.pod or "?", error=line)
        for o in self.inputs().overrides_for(record.cluster):  # the fleet's, the cluster's
            r = o.rollout
            if r is None or (o.cluster, r.id) not in staged:
                continue

            def count(current: Rollout) -> Rollout | None:
                if current.state != "active":
                    return None
                known = _sources(current)
                if source in known:
                    return None
                started = current.stage_started_at
                if started is not None and record.created_at < started:
                    return None  # decided before this stage began
                if not guards(current, record.cluster):
                    return None
                sources = [*known, source]
                failed = current.failed_pods
                failed = failed if where in failed else [*failed, where]
                if len(sources) < current.max_failures:
                    return current.model_copy(
                        update={
                            "failures": len(sources),
                            "failed_pods": failed,
                            "failure_sources": sources,
                        }
                    )
                counted = rollouts.count_sources(sources)
                cause = FailureHalt(
                    sources=len(sources),
                    verified_pods=counted.verified_pods,
                    static_sources=counted.static_sources,
                    max_failures=current.max_failures,
                    pods=[_pod_at(p) for p in failed],
                    latest=failure,
                    backend=backend,
                )
                return _halted(current, failed, cause, sources)

            self._change(o, count, action="rollout.failure", note=f"{where}: {line}", cause=failure)

    def on_measurements(self, report: MeasurementReport) -> None:
        """A pod reported benchmarks. If it is in the stage of an active rollout, compare
        the stage pods' speed of what the override gives them with what they would run
        without it, from the samples reported since the stage began by pods of clusters
        that may halt it; beyond ``max_slowdown_pct`` the rollout halts."""
        request = report_request(report)
        situation = situation_of(request)
        if situation is None:
            return
        inputs = self.inputs()
        now = datetime.now(UTC)
        for o in applicable_overrides(request, inputs.overrides, now):
            r = o.rollout
            if r is None or r.state != "active" or not in_stage(request, o):
                continue
            if not guards(r, request.cluster):
                continue  # this cluster's pods may not halt this rollout
            # the inputs a live decision for this pod uses (evidence it trusts)
            given = self.trusted.inputs_for(request, inputs, now)
            with_it = decide(request, given, now=now)
            without = decide(
                request,
                # what decides this pod is its cluster's share of the overrides
                replace(
                    given,
                    overrides=tuple(x for x in given.overrides_for(request.cluster) if x is not o),
                ),
                now=now,
            )
            if not isinstance(with_it, Decision) or not isinstance(without, Decision):
                continue
            read, source = self._sources_of()
            found = rollouts.slowdown(
                o,
                with_it.backend.value,
                without.backend.value,
                stage_samples(self.trusted, o, situation, read),
                source,
            )
            if found is None:
                continue
            cause = found.cause(r.max_slowdown_pct)

            def halt(current: Rollout, cause: SlowdownHalt = cause) -> Rollout | None:
                if current.state != "active":
                    return None
                return _halted(current, current.failed_pods, cause, _sources(current))

            self._change(o, halt, action="rollout.slowdown", note=words.halt(cause), cause=cause)

    def _sources_of(
        self,
    ) -> tuple[Callable[[Sequence[PodSample]], None], Callable[[str, str], str]]:
        """Each sampled pod's evidence source: the asker of its newest recorded decision
        (a report counts only from that asker, ``Reports.measurements``). The first
        function reads the askers of a list of samples' pods, one query per cluster;
        the second names a pod's source from what was read."""
        known: dict[tuple[str, str], tuple[str | None, bool]] = {}

        def read(samples: Sequence[PodSample]) -> None:
            missing: dict[str, list[str]] = {}
            for cluster, pod, _ in samples:
                if (cluster, pod) not in known:
                    known[(cluster, pod)] = (None, False)
                    missing.setdefault(cluster, []).append(pod)
            for cluster, pods in missing.items():
                for pod, asker in self.askers(cluster, pods).items():
                    known[(cluster, pod)] = asker

        def source(cluster: str, pod: str) -> str:
            principal, verified = known.get((cluster, pod), (None, False))
            return rollouts.evidence_source(principal, verified, cluster, pod, self.static_sources)

        return read, source

    # ------------------------------------------------------------------ steps

    def promote_due(self, now: datetime | None = None, oldest_note: datetime | None = None) -> None:
        """Promote every active rollout whose step passed with no guard fired, once no
        guard evaluation noted before the step came due (``oldest_note``) is left."""
        now = now or datetime.now(UTC)
        for o in self.inputs().overrides:
            r = o.rollout
            step = None if r is None else rollouts.promotion_due(r, now)
            if r is None or step is None:
                continue
            due_at = rollouts.step_due_at(r)
            if oldest_note is not None and due_at is not None and oldest_note <= due_at:
                continue  # a report of this stage is still being judged

            def promote(current: Rollout, r: Rollout = r, step: int = step) -> Rollout | None:
                if current.state != "active" or current.percent != r.percent:
                    return None  # halted meanwhile, or another replica promoted it
                promoted = rollouts.acted(
                    current, "promote", by=SERVICE_ACTOR, note="step", now=now, to=step
                )
                return promoted if isinstance(promoted, Rollout) else None

            note = (
                f"promoted from {r.percent} % to {step} %: no guard fired during the "
                f"{r.step_every} step"
            )
            self._change(o, promote, action="rollout.promote", note=note)

    # ------------------------------------------------------------------ writes

    def _change(
        self,
        o: Override,
        change: Callable[[Rollout], Rollout | None],
        *,
        action: str,
        note: str,
        cause: PodError | SlowdownHalt | None = None,
    ) -> None:
        """Store and audit a change of ``o``'s rollout; ``cause``: what a guard's audit
        entry is about, as data (a scoped reader gets it in its words)."""
        assert o.rollout is not None
        updated = self.config.update_rollout(
            o.cluster,
            o.rollout.id,
            change,
            actor=SERVICE_ACTOR,
            action=action,
            note=note,
            cause=None if cause is None else cause.model_dump(mode="json"),
        )
        if isinstance(updated, Override) and updated.rollout is not None:
            state = updated.rollout.state
            if state == "halted" and o.rollout.state != "halted":
                self.metrics.rollout_changes.labels("halt").inc()
                log.warning("rollout of %s halted: %s", o.label, updated.rollout.halted_reason)
            elif action == "rollout.promote":
                self.metrics.rollout_changes.labels("promote").inc()
                log.info("rollout of %s: %s", o.label, note)
        # Also when nothing changed: the store then holds what this replica has not read
        # yet (another replica's guard halted it first, its reload perhaps still to
        # come). The answer this evaluation gives ("checked") must be what the replica's
        # reads say from then on, not what its next poll would bring.
        try:
            self.live.reload()
        except SQLAlchemyError as exc:  # stored and audited: the next poll applies it
            log.warning(
                "rollout of %s: this replica applies what is stored at its next poll (%s)",
                o.label,
                first_line(exc),
            )


def stage_samples(
    trusted: TrustedEvidence,
    o: Override,
    situation: Situation,
    read: Callable[[Sequence[PodSample]], None] = lambda samples: None,
) -> Callable[[str], list[PodSample]]:
    """A backend's samples in ``situation`` that may halt ``o``'s rollout: of its
    stage's pods (their stored buckets), reported since the stage began, from
    clusters ``guard_clusters`` allows; read from the override's own cluster's
    index, or the all-clusters one for ``*``."""
    r = o.rollout
    assert r is not None
    evidence = trusted.all if o.cluster == "*" else trusted.of_cluster(o.cluster)
    buckets = stage_buckets(r)
    allowed: dict[str, bool] = {}

    def samples(backend: str) -> list[PodSample]:
        found = evidence.stage_samples(situation, backend, buckets, r.stage_started_at)
        out = []
        for sample in found:
            cluster = sample[0]
            ok = allowed.get(cluster)
            if ok is None:
                ok = allowed[cluster] = guards(r, cluster)
            if ok:
                out.append(sample)
        read(out)  # whose they are, before the guard counts their sources
        return out

    return samples


def _sources(current: Rollout) -> list[str]:
    """The evidence sources a rollout's failures counted; a rollout stored before they
    were kept counted its pods by name."""
    if current.failure_sources or not current.failed_pods:
        return current.failure_sources
    return [rollouts.UNATTRIBUTED + where for where in current.failed_pods]


def _halted(
    current: Rollout, failed: list[str], cause: FailureHalt | SlowdownHalt, sources: list[str]
) -> Rollout:
    return current.model_copy(
        update={
            "state": "halted",
            "failures": len(sources),
            "failed_pods": failed,
            "failure_sources": sources,
            "halted_reason": words.halt(cause),
            "halted_cause": cause,
            "halted_at": datetime.now(UTC),
        }
    )


def guards(rollout: Rollout, cluster: str) -> bool:
    """Whether the stage pods of ``cluster`` may halt ``rollout`` (``guard_clusters``)."""
    globs = rollout.guard_clusters
    return cluster_matches(cluster, globs)


def _pod_at(where: str) -> PodAt:
    """A ``failed_pods`` entry ("cluster/pod") as a cause names it."""
    cluster, _, pod = where.partition("/")
    return PodAt(cluster=cluster, pod=pod)
