"""Whose benchmarks a decision trusts (evidence nobody can forge).

Measured selection ranks backends by the fleet's own reports. A report is evidence
only from a pod the service decided for (``POST /v1/measurements``), and, on top of
that, a pod under policy ``measured`` trusts only the reports of some clusters:

- by default its **own cluster** only: a token limited to ``prod-*`` can then sway
  ``prod-*`` pods at most, never ``dev-victim``'s;
- an override's ``trust_clusters: [globs]`` widens (or moves) that, e.g. a fleet
  override ``{"policy": "measured", "trust_clusters": ["bench-*"]}`` lets every pod
  use the benchmark clusters' figures. The most specific override in force that sets
  ``trust_clusters`` wins (the cluster's own over the fleet's ``*``).

Failure evidence (wrong results, build failures) is narrowed the same way: failures
forged in one cluster for every other backend would otherwise push other clusters'
pods onto the one left (TORCH_SDPA, by exclusion instead of by speed). To let failures
seen in staging protect prod, say so: ``trust_clusters: ["prod-*", "staging"]`` on
prod's override.

How the indexes are kept, so that no decision ever builds one: every cluster that
reported has an index of its own (the default scope; a new cluster's is made when its
first report is added), ``*`` is the all-clusters index, and each other scope that an
override names (``bench-*``, or several clusters) has an index built when the
configuration that names it is published, before any decision can use it (in the
config poller's or the admin write's thread), from the trusted clusters' indexes
(their pods' records shared, not copied). Every new observation goes into each index
whose scope trusts its cluster; a full reload files each pod once into all of them
(``Indexes.load``). A decision on the event loop that still meets a
scope without an index (a race with a configuration change) is answered from an empty
index, so the priority list decides and says why, and the index is built in the
background; any other thread (a preview, a guard) builds it and waits.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from mla_switchboard.core.evaluator import DecisionInputs, applicable_overrides
from mla_switchboard.core.evidence import EvidenceIndex, EvidenceLoader, Observation, Situation
from mla_switchboard.core.names import cluster_matches
from mla_switchboard.core.schemas import Override, SelectRequest
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.priority import let_the_loop_in, lower_this_thread

log = logging.getLogger("switchboard.trust")

Scope = tuple[bool, tuple[str, ...]]
"""(set by an override, the cluster globs trusted)"""
Globs = tuple[str, ...]
"""A scope's globs, sorted and without repeats: what its index is filed under"""

GLOB_CHARS = frozenset("*?[")


def trust_scope(request: SelectRequest, inputs: DecisionInputs, now: datetime) -> Scope:
    """Whose evidence ``request`` may be decided on."""
    trusted: Scope = (False, (request.cluster,))  # a cluster name matches only itself
    for o in applicable_overrides(request, inputs.overrides, now):  # fleet first
        if o.trust_clusters is not None:
            trusted = (True, tuple(o.trust_clusters))
    return trusted


def scopes_of(overrides: Iterable[Override]) -> set[Globs]:
    """The scopes that ``overrides`` name and that need an index of their own."""
    named = (_globs(o.trust_clusters) for o in overrides if o.trust_clusters is not None)
    return {globs for globs in named if _own_index(globs)}


def _globs(globs: Sequence[str]) -> Globs:
    return tuple(sorted(set(globs)))


def _literal(glob: str) -> bool:
    return not GLOB_CHARS.intersection(glob)


def _own_index(globs: Globs) -> bool:
    """Whether a scope needs an index of its own: not ``*`` (the all-clusters index)
    and not one cluster by name (that cluster's index)."""
    return "*" not in globs and not (len(globs) == 1 and _literal(globs[0]))


def _trusts(globs: Globs, cluster: str) -> bool:
    return cluster_matches(cluster, globs)


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Indexes:
    """One consistent set of indexes over the same evidence: all clusters, one per
    cluster, and one per scope an override names. Changed only under
    :class:`TrustedEvidence`'s lock (or before it is published, while it is built)."""

    def __init__(self, make_index: Callable[[], EvidenceIndex], scopes: Iterable[Globs]) -> None:
        self._make_index = make_index
        self.all = make_index()
        self.clusters: dict[str, EvidenceIndex] = {}
        self.scopes: dict[Globs, EvidenceIndex] = {globs: make_index() for globs in scopes}
        self.indexes_made = 0  # cluster indexes added since built (see TrustedEvidence)

    def add(self, observations: Iterable[Observation]) -> bool:
        """Every observation into each index whose scope trusts its cluster."""
        batch = list(observations)
        if not self.all.add(batch):
            return False  # what the all-clusters index ignores, every other one ignores
        by_cluster: dict[str, list[Observation]] = {}
        for o in batch:
            by_cluster.setdefault(o.cluster, []).append(o)
        for cluster, mine in by_cluster.items():
            index = self.clusters.get(cluster)
            if index is None:
                index = self.clusters[cluster] = self._make_index()
                self.indexes_made += 1
            index.add(mine)
            for globs, scoped in self.scopes.items():
                if _trusts(globs, cluster):
                    scoped.add(mine)
        return True

    def replace_failures(self, failures: Iterable[Observation]) -> bool:
        """Every index's failures replaced by those of ``failures`` its scope trusts."""
        batch = [o for o in failures if not o.ok]
        by_cluster: dict[str, list[Observation]] = {}
        for o in batch:
            by_cluster.setdefault(o.cluster, []).append(o)
        for cluster in by_cluster:
            if cluster not in self.clusters:
                self.clusters[cluster] = self._make_index()
                self.indexes_made += 1
        changed = self.all.replace_failures(batch)
        for cluster, index in self.clusters.items():
            changed = index.replace_failures(by_cluster.get(cluster, ())) or changed
        for globs, scoped in self.scopes.items():
            mine = [o for o in batch if _trusts(globs, o.cluster)]
            changed = scoped.replace_failures(mine) or changed
        return changed

    def load(self, loader: EvidenceLoader, pause: Callable[[], None] = lambda: None) -> None:
        """Fill this set, still empty and not yet in force, from a bulk read: each pod
        filed once into every index that trusts its cluster (``EvidenceLoader.build``)."""

        def targets(cluster: str) -> list[EvidenceIndex]:
            index = self.clusters.get(cluster)
            if index is None:
                index = self.clusters[cluster] = self._make_index()
                self.indexes_made += 1
            trusting = [scoped for globs, scoped in self.scopes.items() if _trusts(globs, cluster)]
            return [self.all, index, *trusting]

        loader.build(targets, pause)

    def build_scope(self, globs: Globs) -> EvidenceIndex:
        """A new scope's index, from the indexes of the clusters it trusts (their pods'
        records shared, not copied), letting the event loop in between steps."""
        index = self._make_index()
        loader = EvidenceLoader(index.per_pod)
        for cluster, mine in list(self.clusters.items()):
            if _trusts(globs, cluster):
                loader.add_index(mine)
        loader.build(lambda cluster: [index], let_the_loop_in)
        return index

    def every_index(self) -> list[EvidenceIndex]:
        return [self.all, *self.clusters.values(), *self.scopes.values()]

    def retire(self, pause: Callable[[], None]) -> None:
        """Let go of a replaced set in steps (``EvidenceIndex.retire``)."""
        for index in self.every_index():
            index.retire(pause)


class TrustedEvidence:
    """The evidence indexes narrowed to trust scopes, kept up to date incrementally.

    Writers (:meth:`add`, :meth:`swap`, :meth:`ensure_scopes`, :meth:`prune`) take one
    lock; a decision (:meth:`inputs_for`) takes none: it reads the current
    :class:`Indexes` (one attribute) and one dict entry of it.

    :attr:`generation` moves whenever an index a decision may have been given is
    replaced or appears (a swap, a new scope or cluster index) or evidence expired;
    every other change is new evidence in existing indexes, one situation at a time,
    which decisions can follow per situation (``service/selector.py``)."""

    def __init__(
        self,
        make_index: Callable[[], EvidenceIndex],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._make_index = make_index
        self._on_change = on_change  # a scope built late: decisions cached without it go
        self._lock = threading.Lock()
        self._current = Indexes(make_index, ())
        self._empty = make_index().freeze()
        self._wanted: set[Globs] = set()  # the scopes the last configuration named
        self._building: set[Globs] = set()
        self._building_lock = threading.Lock()
        self._generation = 0
        self._read_through = {"measurement_id": 0, "failure_id": 0}

    @property
    def read_through(self) -> dict[str, int]:
        """The newest row ids of measurements and failure reports read into these
        indexes: what a summary of them has shown, so an admin's clear can name the
        failures it clears by their rows (``seen_through``)."""
        return self._read_through

    def note_read_through(self, measurement_id: int, failure_id: int) -> None:
        self._read_through = {"measurement_id": measurement_id, "failure_id": failure_id}

    @property
    def generation(self) -> int:
        return self._generation + self._current.indexes_made

    @property
    def all(self) -> EvidenceIndex:
        """Every cluster's evidence (the summary's, the guards', a ``*`` scope's)."""
        return self._current.all

    def of_cluster(self, cluster: str) -> EvidenceIndex:
        """One cluster's own evidence (empty before its first report): what a read of one
        cluster's samples uses rather than filtering every cluster's."""
        return self._current.clusters.get(cluster, self._empty)

    def unkept(self, globs: Sequence[str]) -> EvidenceIndex:
        """An index of the clusters ``globs`` matches, built now from their own indexes
        (their pods' records shared) and kept by no one: a read for a caller limited to
        those clusters, which the caller's answer cache keeps instead. Off the event
        loop only."""
        with self._lock:
            current = self._current
        return current.build_scope(_globs(globs))

    def add(self, observations: Iterable[Observation]) -> bool:
        """New observations into every index that trusts them; True when any changed."""
        with self._lock:
            return self._current.add(observations)

    def replace_failures(self, failures: Iterable[Observation]) -> bool:
        """Every index's failures replaced by ``failures`` (a reload's read of them)."""
        with self._lock:
            return self._current.replace_failures(failures)

    def fresh(self) -> Indexes:
        """An empty set of indexes with the current scopes, for a full rebuild."""
        return Indexes(self._make_index, list(self._current.scopes))

    def swap(self, fresh: Indexes) -> Indexes:
        """Put a rebuilt set in force, with any scope named while it was built; the set
        it replaced is returned, for the caller to retire once decisions no longer use
        it (``Indexes.retire``)."""
        with self._lock:
            for globs in self._current.scopes.keys() - fresh.scopes.keys():
                fresh.scopes[globs] = fresh.build_scope(globs)
            # counted from the old set: the new one's own count starts at zero
            self._generation += self._current.indexes_made + 1
            old, self._current = self._current, fresh
        return old

    def ensure_scopes(self, overrides: Iterable[Override]) -> bool:
        """Build the index of every scope ``overrides`` name that has none yet (before
        a configuration naming them is published); drop those that neither this nor
        the previous configuration names. True when one was built."""
        wanted = scopes_of(overrides)
        built = False
        with self._lock:
            current = self._current
            for globs in sorted(wanted - current.scopes.keys()):
                current.scopes[globs] = current.build_scope(globs)
                built = True
                self._generation += 1
            for globs in list(current.scopes):
                if globs not in wanted and globs not in self._wanted:
                    del current.scopes[globs]
            self._wanted = wanted
        return built

    def clear_failures(
        self, situation: Situation, backend: Backend | None, before: datetime
    ) -> bool:
        """An admin's clear, in every index (see ``EvidenceIndex.clear_failures``)."""
        with self._lock:
            changed = [
                index.clear_failures(situation, backend, before)
                for index in self._current.every_index()
            ]
        return any(changed)

    def prune(
        self, now: datetime, max_age: timedelta, pause: Callable[[], None] | None = None
    ) -> bool:
        """Drop expired evidence from every index (see ``EvidenceIndex.prune``: what
        expired, not every pod; with ``pause`` called between steps). This lock is not
        held meanwhile: each index has its own, and a report waits for one step at most."""
        with self._lock:
            indexes = self._current.every_index()
        changed = [index.prune(now, max_age, pause) for index in indexes]
        if any(changed):  # a lapsed exclusion changes no situation's published stats
            with self._lock:
                self._generation += 1
        return any(changed)

    def index(self, scope: Scope) -> EvidenceIndex:
        """The index of ``scope``; never built on the event loop (module docstring)."""
        current = self._current
        globs = _globs(scope[1])
        if "*" in globs:
            return current.all
        if len(globs) == 1 and _literal(globs[0]):
            return current.clusters.get(globs[0], self._empty)
        found = current.scopes.get(globs)
        if found is not None:
            return found
        if _on_event_loop():
            self._build_later(globs)
            return self._empty
        return self._scope_index(globs)

    def _scope_index(self, globs: Globs) -> EvidenceIndex:
        """The index of a scope, built now when it has none (off the event loop);
        building one moves the generation and re-publishes, so that decisions cached
        while it was missing (with the empty index) are decided again."""
        with self._lock:
            current = self._current
            found = current.scopes.get(globs)
            built = found is None
            if built:
                found = current.scopes[globs] = current.build_scope(globs)
                self._generation += 1
        if built:
            self._on_change()
        return found

    def _build_later(self, globs: Globs) -> None:
        with self._building_lock:
            if globs in self._building:
                return
            self._building.add(globs)
        threading.Thread(
            target=self._build, args=(globs,), name="evidence-scope", daemon=True
        ).start()

    def _build(self, globs: Globs) -> None:
        lower_this_thread()
        try:
            self._scope_index(globs)
        except Exception:  # a thread of its own: say why, the next decision tries again
            log.exception("building the evidence index of scope %s", globs)
        finally:
            with self._building_lock:
                self._building.discard(globs)

    def inputs_for(
        self, request: SelectRequest, inputs: DecisionInputs, now: datetime
    ) -> DecisionInputs:
        """``inputs`` with the evidence ``request`` may use (the selector's hook)."""
        return replace(inputs, evidence=self.index(trust_scope(request, inputs, now)))
