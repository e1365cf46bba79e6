"""The reads dashboards and admins make of the whole fleet: the summary and previews.

Each is computed from the fleet's counts by group (``service/fleet/groups.py``) on
this replica's one fleet-read thread, within a budget of that thread's CPU time
(``SWITCHBOARD_FLEET_READ_BUDGET_S``, ``Deadline``), and kept per every version it
depends on: the configuration and evidence in force (``DecisionInputs.tag``), which
overrides have expired, the fleet's counts (``fleet_version``) and the caller's cluster
scope. Identical requests at the same time share one computation; a repeated one is a
lookup, and its ETag lets a polling dashboard get a 304 without a body. Below that,
each cluster's share of a summary or a preview is kept across versions until what it
depends on changes (``service/fleet/parts.py``): a new version costs the clusters it
changed.

The thread is one, so however many dashboards and admins ask for different things at
once, at most one fleet read competes with the event loop; it runs at a lower
priority than the loop and hands it the interpreter between groups
(``service/priority.py``), and the summary's JSON is encoded there too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as NotYet
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from mla_switchboard.core import cause_words
from mla_switchboard.core.evaluator import DecisionInputs
from mla_switchboard.core.schemas import FLEET, Override, RulesDocument
from mla_switchboard.service import json_bytes
from mla_switchboard.service.collector import Collector, paused
from mla_switchboard.service.evidence.trust import TrustedEvidence
from mla_switchboard.service.fleet.computed import Computed
from mla_switchboard.service.fleet.figures import SummaryFigures
from mla_switchboard.service.fleet.groups import Deadline, Fleet, FleetSnapshot, OverBudget
from mla_switchboard.service.fleet.parts import ClusterParts, PartsRead
from mla_switchboard.service.fleet.preview import Preview, replay, with_override
from mla_switchboard.service.fleet.progress import RolloutTally
from mla_switchboard.service.priority import (
    Releases,
    let_go_later,
    lower_this_thread,
)
from mla_switchboard.service.store.recorder import DecisionRecorder
from sqlalchemy.exc import SQLAlchemyError

T = TypeVar("T")

Visible = Callable[[str], bool] | None
"""Which clusters the caller may see (None: every cluster)."""

Redact = Callable[[dict[str, Any]], dict[str, Any]] | None
"""An answer as the caller may read it (None: as it is)."""


@dataclass(frozen=True)
class Answer:
    """A fleet read's result with the ETag naming everything it depends on, and the
    body encoded once (off the event loop) for every caller it is sent to."""

    body: dict[str, Any]
    etag: str
    content: bytes = b""

    @classmethod
    def of(cls, body: dict[str, Any], etag: str) -> Answer:
        return cls(body, etag, json_bytes.encode(body))


@dataclass(frozen=True)
class Proposal:
    """A change to preview: new rules, or one scope's override put (or deleted: None)."""

    rules: RulesDocument | None = None
    override_scope: str | None = None
    override: Override | None = None

    def digest(self) -> str:
        body = {
            "rules": None if self.rules is None else self.rules.rules_only(),
            "scope": self.override_scope,
            "override": None
            if self.override is None
            else self.override.model_dump(
                mode="json", exclude={"created_at", "created_by", "revision"}
            ),
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def applied_to(self, current: DecisionInputs) -> DecisionInputs:
        overrides = current.overrides
        if self.override_scope is not None:
            overrides = tuple(with_override(overrides, self.override_scope, self.override))
        return replace(
            current,
            rules=self.rules if self.rules is not None else current.rules,
            overrides=overrides,
            tag=(-1, -1),
        )


@dataclass(frozen=True)
class ReadSettings:
    """What fleet reads need of the settings."""

    budget_s: float  # SWITCHBOARD_FLEET_READ_BUDGET_S
    min_samples: int  # SWITCHBOARD_MEASURED_MIN_SAMPLES
    min_pods: int  # SWITCHBOARD_MEASURED_MIN_PODS


def _read_worker() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix="fleet-read", initializer=lower_this_thread)


@dataclass(eq=False)
class FleetReads:
    """``inputs``: the decision inputs in force. Each kind of answer has its own
    cache; the slow ones are computed on one low-priority worker thread."""

    fleet: Fleet
    recorder: DecisionRecorder
    trusted: TrustedEvidence
    inputs: Callable[[], DecisionInputs]
    settings: ReadSettings
    collector: Collector | None = None
    """Paused while a read runs (``service/collector.py``); None: left alone."""
    read_back: Callable[[], object] = lambda: None
    """Read this replica's own reports back from the store when some were applied in
    memory only (``EvidenceSync.read_back``): the evidence summary's ``seen_through``
    then covers the failures it shows, so a clear of them clears them."""
    _summaries: Computed[Answer] = field(init=False, default_factory=lambda: Computed(64))
    _previews: Computed[Preview] = field(init=False, default_factory=lambda: Computed(256))
    _evidence: Computed[Answer] = field(init=False, default_factory=lambda: Computed(64))
    _worker: ThreadPoolExecutor = field(init=False, default_factory=_read_worker)
    _parts: ClusterParts = field(init=False, default_factory=ClusterParts)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _serially(self, compute: Callable[[], T]) -> T:
        """``compute`` on the fleet-read thread (module docstring). A read that could
        not even start within the budget, because others kept the thread busy, is
        over budget; one that started ends within its own."""
        budget = self.settings.budget_s

        def released() -> T:
            paused_until_let_go = contextlib.ExitStack()
            paused_until_let_go.enter_context(paused(self.collector))
            releases = Releases()
            try:
                with releases.collecting():
                    return compute()
            finally:
                self._after_the_answer(releases, paused_until_let_go)

        future = self._worker.submit(released)
        try:
            return future.result(timeout=budget)
        except NotYet:
            if future.cancel():
                raise OverBudget(
                    f"other fleet reads kept this replica busy for {budget:g} s"
                ) from None
            return future.result()

    def _after_the_answer(self, releases: Releases, pause: contextlib.ExitStack) -> None:
        """What a read built is let go of a piece at a time (``priority.Releases``: at a
        fleet-wide preview, ~14 % of the read) after its answer is handed back, as a
        job of its own on this thread, so the next read starts after it. The collector
        stays paused until it ends, so nothing of it is frozen (``service/collector.py``);
        a job cancelled because the replica stops lets go at once."""

        def let_go() -> None:
            try:
                releases.release()
            finally:
                pause.close()

        try:
            job = self._worker.submit(let_go)
        except RuntimeError:  # the thread is shut down: nothing more runs on it
            let_go()
            return
        job.add_done_callback(lambda done: let_go() if done.cancelled() else None)

    def _fresh(self) -> tuple[DecisionInputs, FleetSnapshot, datetime]:
        """The inputs and the fleet as of now: this replica's own decisions so far are
        in it, so the caller sees the pods it just booted. It waits for the writer's
        next batch (at most the flush interval) rather than waking it: a client
        looping on reads must not make the writer write smaller, more batches. When
        they cannot be stored within the store deadline the read answers 503
        (``settle_for_read``), never a fleet without them."""
        if self.recorder.pending:
            self.recorder.settle_for_read(wake=False)
        return self.inputs(), self.fleet.current(), datetime.now(UTC)

    def _kept_state(self) -> tuple[DecisionInputs, FleetSnapshot, datetime] | None:
        """Like ``_fresh`` but without I/O or waiting, for the event loop: None when
        the fleet's snapshot is behind or this replica has decisions to write."""
        fleet = self.fleet.kept()
        if fleet is None or self.recorder.pending:
            return None
        return self.inputs(), fleet, datetime.now(UTC)

    def _deadline(self) -> Deadline:
        return Deadline(self.settings.budget_s)

    def summary(
        self, scope: tuple[str, ...] | None, visible: Visible, redact: Redact = None
    ) -> Answer:
        """``/v1/selections/summary`` for a caller whose token covers ``scope``;
        ``redact``: the answer as that caller may read it (kept with the answer, which
        is kept per scope)."""
        inputs, fleet, now = self._fresh()
        key = ("summary", *_versions(inputs, fleet, now), scope)
        return self._summaries.get(
            key,
            lambda: self._serially(lambda: self._summary(key, inputs, fleet, now, visible, redact)),
        )

    def kept_summary(self, scope: tuple[str, ...] | None) -> Answer | None:
        """The summary ``summary`` would answer now, when it is kept and current: no
        I/O, so the event loop answers a polling dashboard without a worker thread."""
        state = self._kept_state()
        if state is None:
            return None
        return self._summaries.peek(("summary", *_versions(*state), scope))

    def _summary(
        self,
        key: tuple[Any, ...],
        inputs: DecisionInputs,
        fleet: FleetSnapshot,
        now: datetime,
        visible: Visible,
        redact: Redact = None,
    ) -> Answer:
        """Added up cluster by cluster from the kept parts (``service/fleet/parts.py``):
        only the clusters whose groups, overrides, rules or evidence changed since are
        worked out again."""
        self._parts.forget_others(fleet.by_cluster)
        fleet = fleet.visible(visible)
        parts = let_go_later(self._parts_of(fleet, inputs, now))  # the read's memos
        figures = SummaryFigures(parts)
        clusters = sorted(fleet.by_cluster)
        excluded = {c: found for c in clusters if (found := figures.excluded(c))}
        body: dict[str, Any] = {
            "clusters": {c: figures.counts(c) for c in clusters},
            "regret": {c: figures.regret(c) for c in clusters},
            "excluded": {
                c: {b: cause_words.exclusion(why) for b, why in found.items()}
                for c, found in excluded.items()
            },
            "excluded_causes": {
                c: {b: why.model_dump(mode="json") for b, why in found.items()}
                for c, found in excluded.items()
            },
            "rollouts": [
                r
                for r in _progress(figures, inputs, clusters)
                if visible is None or visible(r["cluster"])
            ],
        }
        return Answer.of(body if redact is None else redact(body), _etag(key))

    def _parts_of(self, fleet: FleetSnapshot, inputs: DecisionInputs, now: datetime) -> PartsRead:
        return self._parts.reading(
            fleet,
            inputs,
            now,
            inputs_for=self.trusted.inputs_for,
            evidence_of=self.trusted.of_cluster,
            deadline=self._deadline(),
        )

    def preview(
        self, proposal: Proposal, scope: tuple[str, ...] | None, visible: Visible
    ) -> Preview:
        """What ``proposal`` would change for the pods ``visible`` to the caller."""
        inputs, fleet, now = self._fresh()
        key = ("preview", *_versions(inputs, fleet, now), proposal.digest(), scope)

        def compute() -> Preview:
            self._parts.forget_others(fleet.by_cluster)
            return self._preview(proposal, inputs, fleet.visible(visible), now)

        return self._previews.get(key, lambda: self._serially(compute))

    def _preview(
        self, proposal: Proposal, inputs: DecisionInputs, fleet: FleetSnapshot, now: datetime
    ) -> Preview:
        """The clusters the proposal touches are replayed; every other one's pending pods
        are a kept per-cluster figure (``replay``'s ``settled``)."""
        parts = let_go_later(self._parts_of(fleet, inputs, now))  # the read's memos
        return replay(
            fleet,
            inputs,
            proposal.applied_to(inputs),
            now=now,
            inputs_for=parts.inputs_for,
            deadline=parts.deadline,
            settled=parts,
            classes=parts.classes,
            memo=parts.memo,
        )

    def kept_preview(self, proposal: Proposal, scope: tuple[str, ...] | None) -> Preview | None:
        """The preview ``preview`` would answer now, when kept and current (no I/O)."""
        state = self._kept_state()
        if state is None:
            return None
        return self._previews.peek(("preview", *_versions(*state), proposal.digest(), scope))

    def evidence_summary(
        self, scope: tuple[str, ...] | None = None, visible: Visible = None
    ) -> Answer:
        """``/v1/measurements/summary``: the evidence per situation and backend, kept
        per evidence version and generation (an exclusion that lapses moves the
        generation), so a polling dashboard gets a 304 while no report arrives. A
        caller whose token covers ``scope`` reads failures of the clusters ``visible``
        accepts quoted and the others counted: kept, and tagged, per scope."""
        inputs = self.inputs()
        # the rows read too: a report applied here at once is read back (its row id
        # then in seen_through) without changing the evidence
        with contextlib.suppress(SQLAlchemyError):  # else as read so far: a clear
            self.read_back()  # then keeps what it did not see
        through = self.trusted.read_through
        key = ("evidence", inputs.tag[1], inputs.evidence_generation, scope, *through.values())
        return self._evidence.get(
            key, lambda: self._serially(lambda: self._evidence_of(key, visible, scope))
        )

    def _evidence_of(
        self, key: tuple[Any, ...], visible: Visible, scope: tuple[str, ...] | None = None
    ) -> Answer:
        evidence = self.inputs().evidence
        groups = evidence.summary(datetime.now(UTC), visible)
        if scope is not None:
            groups = _own_figures(groups, self.trusted.unkept(scope).summary())
        body = {
            "groups": groups,
            "failure_policy": evidence.failure_policy.describe(),
            "min_samples": self.settings.min_samples,
            "min_pods": self.settings.min_pods,
            # what a clear of these failures sends back (POST .../failures/clear)
            "seen_through": self.trusted.read_through,
        }
        return Answer.of(body, _etag(key))

    @property
    def preview_computations(self) -> int:
        return self._previews.computations


def _progress(
    figures: SummaryFigures, inputs: DecisionInputs, clusters: list[str]
) -> list[dict[str, Any]]:
    """Each staged override's progress (``fleet/progress.py``), added up from the parts
    of the clusters it covers: its own cluster's, or every cluster's for ``*``."""
    out = []
    overrides = inputs.override_set
    fleet_wide = overrides.own(FLEET)
    shown = set(clusters)
    for o in sorted(overrides, key=lambda o: o.cluster):
        if o.rollout is None:
            continue
        tally = RolloutTally.of(o)
        if o.cluster == FLEET:
            position = _position(fleet_wide, o)
            for cluster in clusters:
                tally.merge(figures.progress(cluster, position, o))
        elif o.cluster in shown:
            position = len(fleet_wide) + _position(overrides.own(o.cluster), o)
            tally.merge(figures.progress(o.cluster, position, o))
        out.append(tally.summary())
    return out


def _position(overrides: tuple[Override, ...], o: Override) -> int:
    return next(i for i, x in enumerate(overrides) if x is o)


def _versions(inputs: DecisionInputs, fleet: FleetSnapshot, now: datetime) -> tuple[Any, ...]:
    expired = tuple(o.expires_at is not None and o.expires_at <= now for o in inputs.overrides)
    return (inputs.tag, expired, fleet.version)


_EPOCH = os.urandom(8).hex()
"""This process's own: the versions in a key are counted per replica from its start, so
the same numbers on another replica, or after a restart, may stand for other content."""


def _etag(key: tuple[Any, ...]) -> str:
    text = repr((_EPOCH, key)).encode()
    return '"' + hashlib.blake2b(text, digest_size=12).hexdigest() + '"'


_FIGURES = ("impls", "samples", "pods", "median_tflops")
"""What a measurements summary row says of the measurements themselves."""
_NO_FIGURES: dict[str, Any] = {"impls": [], "samples": 0, "pods": 0, "median_tflops": None}
_SITUATION = ("device", "capability", "dims", "dtype", "engine", "backend", "packages")
"""What a measurements summary row is the figures of."""


def _own_figures(groups: list[dict[str, Any]], own: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fleet's rows (``groups``) for a caller limited to some clusters: each row's
    figures are those of its own clusters' evidence (``own``: the summary of an index
    of theirs, built for the read), so another cluster's samples, pods and
    the ``impl`` its agents wrote never show; the failures of other clusters stay
    counted (never named) in ``failures`` and ``excluded``. A row with neither figures
    of its own nor failures is another cluster's alone, and is left out."""
    mine = {_situation_key(g): g for g in own}
    out = []
    for g in groups:
        found = mine.get(_situation_key(g))
        if found is None and not g["failures"]:
            continue
        figures = _NO_FIGURES if found is None else {f: found[f] for f in _FIGURES}
        out.append({**g, **figures})
    return out


def _situation_key(g: dict[str, Any]) -> str:
    return json.dumps([g[f] for f in _SITUATION], sort_keys=True)
