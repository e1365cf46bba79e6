"""The one ``DecisionInputs`` every decision reads, rebuilt when what it holds changes.

The configuration snapshot (``service/live/poller.py``) and the trusted evidence
(``service/evidence/trust.py``) change on their own threads; each change is
published here as a whole new ``DecisionInputs``, so the hot path reads one
attribute and never a half-applied change.
"""

from __future__ import annotations

import threading
from datetime import timedelta

from mla_switchboard.core.evaluator import DecisionInputs
from mla_switchboard.core.evidence import EvidenceIndex, FailurePolicy
from mla_switchboard.service.config import Settings
from mla_switchboard.service.evidence.trust import TrustedEvidence
from mla_switchboard.service.state import ConfigSnapshot


class InputsPublisher:
    """Builds and swaps in the inputs of every decision (see the module docstring)."""

    def __init__(self, trusted: TrustedEvidence) -> None:
        self._trusted = trusted
        self._lock = threading.RLock()
        self._snapshot: ConfigSnapshot | None = None
        self._evidence_version = 0
        self._inputs: DecisionInputs | None = None

    def config_changed(self, snapshot: ConfigSnapshot) -> None:
        """A new configuration snapshot is in force."""
        with self._lock:
            self._snapshot = snapshot
            self._publish(evidence_changed=False)

    def evidence_changed(self) -> None:
        """The trusted evidence changed (new reports, a clear, a scope built)."""
        self._publish(evidence_changed=True)

    def _publish(self, evidence_changed: bool) -> None:
        """The evidence index of every trust scope the snapshot's overrides name is
        built here, before the snapshot is in force, so no decision has to build one.
        New evidence moves the evidence version (kept fleet reads follow it); decisions
        cached by the selector follow the evidence generation and, per situation, what
        they read."""
        with self._lock:
            snap = self._snapshot
            if snap is not None and self._trusted.ensure_scopes(snap.overrides):
                evidence_changed = True
            if evidence_changed:
                self._evidence_version += 1
            if snap is None:
                return
            self._inputs = DecisionInputs(
                rules=snap.rules,
                overrides=snap.overrides,
                evidence=self._trusted.all,
                tag=(snap.version, self._evidence_version),
                evidence_generation=self._trusted.generation,
            )

    def current(self) -> DecisionInputs:
        """The inputs in force (only once the first snapshot was published)."""
        inputs = self._inputs
        assert inputs is not None, "runtime not started"
        return inputs


def index_factory(settings: Settings) -> EvidenceIndex:
    """An empty evidence index under the settings' thresholds and failure policy."""
    return EvidenceIndex(
        min_samples=settings.measured_min_samples,
        min_pods=settings.measured_min_pods,
        failure_policy=FailurePolicy(
            min_pods=settings.failure_min_pods,
            window=timedelta(hours=settings.failure_window_hours),
        ),
        per_pod=settings.measured_samples_per_pod,
    )
