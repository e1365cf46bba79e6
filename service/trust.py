"""Whose benchmarks a decision trusts (issue 13: evidence nobody can forge).

Measured selection ranks backends by the fleet's own reports. A report is evidence
only from a pod the service decided for (``POST /v1/measurements``), and, on top of
that, a pod under policy ``measured`` trusts only the reports of some clusters:

- by default its **own cluster** only: a token limited to ``prod-*`` can then sway
  ``prod-*`` pods at most, never ``dev-victim``'s (the finding);
- an override's ``trust_clusters: [globs]`` widens (or moves) that, e.g. a fleet
  override ``{"policy": "measured", "trust_clusters": ["bench-*"]}`` lets every pod
  use the benchmark clusters' figures. The most specific override in force that sets
  ``trust_clusters`` wins (the cluster's own over the fleet's ``*``).

Failure evidence (wrong results, build failures) is narrowed the same way: failures
forged in one cluster for every other backend would otherwise push other clusters'
pods onto the one left (the finding's TORCH_SDPA, by exclusion instead of by speed).
To let failures seen in staging protect prod, say so: ``trust_clusters: ["prod-*",
"staging"]`` on prod's override. Indexes are built per trust scope on first use and
kept until the evidence changes.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from mla_switchboard.core.evaluator import DecisionInputs, applicable_overrides
from mla_switchboard.core.evidence import EvidenceIndex, Observation
from mla_switchboard.core.schemas import SelectRequest

Scope = tuple[bool, tuple[str, ...]]
"""(set by an override, the cluster globs trusted)"""


def trust_scope(request: SelectRequest, inputs: DecisionInputs, now: datetime) -> Scope:
    """Whose evidence ``request`` may be decided on."""
    trusted: Scope = (False, (request.cluster,))  # a cluster name matches only itself
    for o in applicable_overrides(request, inputs.overrides, now):  # fleet first
        if o.trust_clusters is not None:
            trusted = (True, tuple(o.trust_clusters))
    return trusted


def _trusted(o: Observation, scope: Scope) -> bool:
    return any(fnmatch.fnmatchcase(o.cluster, glob) for glob in scope[1])


class TrustedEvidence:
    """Evidence indexes narrowed to trust scopes, over one set of observations."""

    def __init__(self, make_index: Callable[[list[Observation]], EvidenceIndex]) -> None:
        self._make_index = make_index
        self._lock = threading.Lock()
        self._observations: tuple[Observation, ...] = ()
        self._version = -1
        self._indexes: dict[Scope, EvidenceIndex] = {}

    def reset(self, observations: Sequence[Observation], version: int) -> None:
        with self._lock:
            self._observations = tuple(observations)
            self._version = version
            self._indexes = {}

    def extend(self, observations: Sequence[Observation], version: int) -> None:
        """Fold a report into the indexes already built (each takes what its scope
        trusts), rather than dropping them: otherwise every report made the next
        decision of every scope rebuild its index from all observations on the hot
        path."""
        with self._lock:
            self._observations = self._observations + tuple(observations)
            self._version = version
            self._indexes = {
                scope: index.with_observations([o for o in observations if _trusted(o, scope)])
                for scope, index in self._indexes.items()
            }

    def index(self, scope: Scope) -> EvidenceIndex:
        with self._lock:
            found = self._indexes.get(scope)
            if found is None:
                found = self._make_index([o for o in self._observations if _trusted(o, scope)])
                self._indexes[scope] = found
            return found

    def inputs_for(
        self, request: SelectRequest, inputs: DecisionInputs, now: datetime
    ) -> DecisionInputs:
        """``inputs`` with the evidence ``request`` may use (the selector's hook)."""
        return replace(inputs, evidence=self.index(trust_scope(request, inputs, now)))
