"""The evidence index's writer: observations folded into tallies under a lock, each
changed situation's summaries published at once, expired evidence pruned in steps; and
the reads that need the tallies themselves (every sample, a stage's samples)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from mla_switchboard.core.evidence.observations import (
    FailureNote,
    FailurePolicy,
    Observation,
    backend_of,
)
from mla_switchboard.core.evidence.published import PublishedEvidence
from mla_switchboard.core.evidence.records import (
    IMPL_NAMES,
    RECORD,
    SAMPLES_PER_POD,
    impl_id_of,
    sample_key,
    split_key,
    time_back,
)
from mla_switchboard.core.evidence.situations import Situation
from mla_switchboard.core.evidence.stats import NO_GROUP, PodSample
from mla_switchboard.core.evidence.tallies import LOAD_STEP, Tally
from mla_switchboard.core.specs import Backend
from mla_switchboard.core.stages import pod_key, stage_bucket_of_key
from sortedcontainers import SortedList

__all__ = ["EMPTY", "PRUNE_STEP", "EvidenceIndex"]

_MISSING: Any = object()

PRUNE_STEP = 1000
"""Heap entries a prune pops between two pauses (a few ms, during which a report
waits for the index's lock)."""


class EvidenceIndex(PublishedEvidence):
    """Evidence per situation and backend, with a bounded cost (package docstring).

    Writers (:meth:`add`, :meth:`prune`) take an internal lock and, when done, publish
    each changed situation's summaries as a new mapping with one assignment; readers
    (:meth:`group`, :meth:`exclusions`, :meth:`eligible`, :meth:`rank`, from
    :class:`PublishedEvidence`) take no lock and read only those published mappings.
    ``version`` changes on every write that changed something. What a tally holds is
    read here, under the lock (:meth:`stage_samples`, :meth:`counted`, ...).
    """

    __slots__ = ("_earliest", "_frozen", "_next_lapse", "_tallies", "per_pod", "pruned")

    def __init__(
        self,
        observations: Iterable[Observation] = (),
        *,
        min_samples: int = 3,
        min_pods: int = 2,
        failure_policy: FailurePolicy | None = None,
        per_pod: int = SAMPLES_PER_POD,
    ) -> None:
        if per_pod < 1:
            raise ValueError("per_pod must be at least 1")
        super().__init__(min_samples=min_samples, min_pods=min_pods, failure_policy=failure_policy)
        self.per_pod = per_pod
        self._tallies: dict[Situation, dict[Backend, Tally]] = {}
        self._frozen = False
        self._earliest = math.inf  # no sample or failure is older: prune has nothing to do
        self._next_lapse = math.inf  # when a failure next leaves the policy's window
        self.pruned = 0
        """Heap entries and failures the last prune looked at (what it cost)."""
        self.add(observations)

    # ---------------------------------------------------------------- writes

    def add(self, observations: Iterable[Observation]) -> bool:
        """Fold ``observations`` in; True when anything that counts changed.

        Per observation: a few dict lookups, a binary search and a memmove in the sorted
        TFLOP/s of its backend; each changed situation is published once at the end."""
        if self._frozen:
            raise TypeError("this evidence index is shared and read-only")
        with self._lock:
            touched: dict[Situation, set[Backend]] = {}
            self._fold(observations, touched)
            self._publish(touched)
            return bool(touched)

    def replace_failures(self, failures: Iterable[Observation]) -> bool:
        """Every failure forgotten and ``failures`` noted instead, published at once (a
        reload reads them again from the store, where an admin may have cleared some):
        no reader sees the index between the two. Samples stay as they are."""
        if self._frozen:
            raise TypeError("this evidence index is shared and read-only")
        with self._lock:
            touched: dict[Situation, set[Backend]] = {}
            cleared: list[tuple[Situation, Backend]] = []
            for situation, tallies in self._tallies.items():
                for backend, tally in tallies.items():
                    if tally.clear_failures(math.inf):
                        touched.setdefault(situation, set()).add(backend)
                        cleared.append((situation, backend))
            self._fold((o for o in failures if not o.ok), touched)
            for situation, backend in cleared:  # tallies that held only failures
                tallies = self._tallies.get(situation, {})
                tally = tallies.get(backend)
                if tally is not None and tally.empty():
                    del tallies[backend]
                    if not tallies:
                        del self._tallies[situation]
            self._publish(touched)
            return bool(touched)

    def _fold(
        self, observations: Iterable[Observation], touched: dict[Situation, set[Backend]]
    ) -> None:
        """``observations`` into the tallies (caller holds the lock), what changed
        noted in ``touched``."""
        # a report's results share one situation and pod: find each once per call
        found: dict[tuple[Situation, str], tuple[Backend, Tally] | None] = {}
        buckets: dict[str, int | None] = {}
        for o in observations:
            key = (o.situation, o.backend)
            target = found.get(key, _MISSING)
            if target is _MISSING:
                backend = backend_of(o.backend)
                target = found[key] = (
                    None if backend is None else (backend, self._tally(o.situation, backend))
                )
            if target is None:
                continue
            pod = pod_key(o.cluster, o.pod)
            bucket = buckets.get(pod, _MISSING)
            if bucket is _MISSING:
                bucket = buckets[pod] = stage_bucket_of_key(pod)
            if self._apply(o, target[1], sys.intern(pod), bucket):  # type: ignore[arg-type]
                touched.setdefault(o.situation, set()).add(target[0])
        for situation, backend_name in list(found):  # tallies made for nothing
            target = found[(situation, backend_name)]
            if target is not None and target[1].empty():
                self._tallies[situation].pop(target[0], None)
                if not self._tallies[situation]:
                    del self._tallies[situation]

    def _apply(self, o: Observation, tally: Tally, key: str, bucket: int | None) -> bool:
        if o.ok:
            if o.tflops is None or math.isnan(o.tflops):
                return False
            at, impl = sample_key(o.at), impl_id_of(o.impl)
            if not tally.add_sample(key, bucket, at, float(o.tflops), impl, self.per_pod):
                return False
            if at > -math.inf:
                self._earliest = min(self._earliest, at)
            return True
        note = FailureNote(o.cluster, o.pod, o.at, o.error or "wrong result or failed build")
        if not tally.add_failure(key, note):
            return False
        if o.at is not None:
            at = o.at.timestamp()
            self._earliest = min(self._earliest, at)
            self._next_lapse = min(
                self._next_lapse, at + self.failure_policy.window.total_seconds()
            )
        return True

    def _tally(self, situation: Situation, backend: Backend) -> Tally:
        group = self._tallies.setdefault(situation, {})
        found = group.get(backend)
        if found is None:
            found = group[backend] = Tally()
        return found

    def _publish(self, touched: Mapping[Situation, Iterable[Backend]]) -> None:
        """Replace each touched situation's summaries (one assignment each): a reader
        sees all of one write's changes to a situation, or none."""
        for situation, backends in touched.items():
            tallies = self._tallies.get(situation, {})
            group = dict(self._published.get(situation, NO_GROUP))
            for backend in backends:
                tally = tallies.get(backend)
                if tally is None or tally.empty():
                    tallies.pop(backend, None)
                    group.pop(backend, None)
                else:
                    group[backend] = tally.stats()
            if group:
                self._published[situation] = MappingProxyType(group)
            else:
                self._published.pop(situation, None)
                self._tallies.pop(situation, None)
        if touched:
            self._version += 1

    def clear_failures(
        self, situation: Situation, backend: Backend | None, before: datetime
    ) -> bool:
        """Forget the failures of ``situation`` (one backend, or all) noted at or before
        ``before``: an admin declared them fixed (a new driver, a patched kernel). Later
        failures stay, and so do samples. True when anything changed."""
        if self._frozen:
            raise TypeError("this evidence index is shared and read-only")
        cutoff = before.timestamp()
        with self._lock:
            touched: dict[Situation, list[Backend]] = {}
            for b, tally in self._tallies.get(situation, {}).items():
                if (backend is None or b is backend) and tally.clear_failures(cutoff):
                    touched.setdefault(situation, []).append(b)
            self._publish(touched)
            return bool(touched)

    def prune(
        self, now: datetime, max_age: timedelta, pause: Callable[[], None] | None = None
    ) -> bool:
        """Drop samples and failures older than ``max_age`` (the evidence window).

        True when anything changed, or when a failure left the failure policy's window
        since the last prune (an exclusion a cached decision holds has lapsed). Costs
        O(1) while nothing is due, and otherwise what expired: each backend's heap of
        expiry times is popped up to the cutoff, never every pod. With ``pause``, the
        lock is let go and ``pause`` called every ``PRUNE_STEP`` entries (each step
        publishes what it dropped, as a prune at a slightly earlier time would)."""
        cutoff = (now - max_age).timestamp()
        now_ts = now.timestamp()
        window = self.failure_policy.window.total_seconds()
        with self._lock:
            self.pruned = 0
            lapsed = now_ts >= self._next_lapse
            if cutoff <= self._earliest and not lapsed:
                return False
        changed = False
        handled: dict[str, float] = {}
        while True:
            with self._lock:
                touched: dict[Situation, list[Backend]] = {}
                budget = PRUNE_STEP if pause is not None else math.inf
                for situation, tallies in self._tallies.items():
                    for backend, tally in tallies.items():
                        if budget > 0 and tally.due(cutoff):
                            moved, used = tally.prune(cutoff, budget, handled)  # type: ignore[arg-type]
                            budget -= used
                            self.pruned += used
                            if moved:
                                touched.setdefault(situation, []).append(backend)
                self._publish(touched)
                changed = changed or bool(touched)
                if budget > 0:  # nothing left to drop
                    earliest = next_lapse = math.inf
                    for tallies in self._tallies.values():
                        for tally in tallies.values():
                            earliest = min(earliest, tally.earliest())
                            if tally.failures:
                                next_lapse = min(next_lapse, tally.next_lapse(now_ts, window))
                    self._earliest, self._next_lapse = earliest, next_lapse
                    if lapsed and not changed:
                        self._version += 1
                    return lapsed or changed
            if pause is not None:
                pause()

    def retire(self, pause: Callable[[], None] = lambda: None) -> None:
        """Let go of what this index counts, in steps with ``pause`` between them: a
        newer index replaced it (a full reload), and freeing 100,000 pods at once, as
        dropping the last reference does, held the interpreter for 50 ms. A reader that
        still holds it sees its published summaries as they were, and no samples."""
        with self._lock:
            tallies, self._tallies = self._tallies, {}
        freed = 0
        for group in tallies.values():
            for tally in group.values():
                while tally.buckets:
                    freed += len(tally.buckets.popitem()[1])
                    if freed >= LOAD_STEP:
                        freed = 0
                        pause()
                while tally.expiry:
                    del tally.expiry[-LOAD_STEP:]
                    pause()
                tally.values = SortedList()
        pause()

    def freeze(self) -> EvidenceIndex:
        """Make :meth:`add` refuse: for an index that callers share (:data:`EMPTY`)."""
        self._frozen = True
        return self

    # ----------------------------------------------------- reads of the tallies

    def samples(self, situation: Situation | None, backend: Backend | str) -> list[PodSample]:
        """(cluster, pod, TFLOP/s) of every counted sample, a snapshot. It walks the
        whole situation's history: requests read :meth:`stage_samples` instead, this is
        for tools and tests that want everything."""
        found = backend_of(backend) if isinstance(backend, str) else backend
        if situation is None or found is None:
            return []
        with self._lock:
            tally = self._tallies.get(situation, {}).get(found)
            if tally is None:
                return []
            out: list[PodSample] = []
            for key, record in tally.records():
                cluster, pod = split_key(key)
                out.extend((cluster, pod, value) for _, value, _ in RECORD.iter_unpack(record))
            return out

    def stage_samples(
        self,
        situation: Situation | None,
        backend: Backend | str,
        buckets: Iterable[int | None],
        since: datetime | None = None,
    ) -> list[PodSample]:
        """(cluster, pod, TFLOP/s) of the counted samples of the pods whose stage bucket
        is in ``buckets`` (None: pods without a name), reported at or after ``since``
        (None: whenever; a sample without a time is never after a given ``since``).

        What a rollout guard compares and the rollout progress shows: the buckets are
        stored with the pods, so this reads those buckets' pods that reported since
        ``since`` and nothing else; its cost does not grow with the rest of the
        situation's history (pods outside the stage, samples from before it)."""
        found = backend_of(backend) if isinstance(backend, str) else backend
        if situation is None or found is None:
            return []
        key = -math.inf if since is None else since.timestamp()
        with self._lock:
            tally = self._tallies.get(situation, {}).get(found)
            return [] if tally is None else tally.in_buckets(buckets, key)

    def pod_samples(
        self, situation: Situation | None, backend: Backend | str, cluster: str, pod: str
    ) -> list[float]:
        """TFLOP/s of one pod's counted samples (at most ``per_pod``), oldest first."""
        found = backend_of(backend) if isinstance(backend, str) else backend
        if situation is None or found is None:
            return []
        key = pod_key(cluster, pod)
        with self._lock:
            tally = self._tallies.get(situation, {}).get(found)
            record = None if tally is None else tally.record(key, stage_bucket_of_key(key))
            return [] if record is None else [v for _, v, _ in RECORD.iter_unpack(record)]

    def counted(self) -> list[Observation]:
        """Everything that counts, as observations (a snapshot): what another index
        needs to hold the same evidence."""
        out: list[Observation] = []
        with self._lock:
            for situation, tallies in self._tallies.items():
                for backend, tally in tallies.items():
                    for key, record in tally.records():
                        cluster, pod = split_key(key)
                        out.extend(
                            Observation(situation, backend.value, pod, t, ok=True,
                                        cluster=cluster, at=time_back(at),
                                        impl=IMPL_NAMES[impl])
                            for at, t, impl in RECORD.iter_unpack(record)
                        )  # fmt: skip
                    out.extend(
                        Observation(situation, backend.value, n.pod, None, ok=False,
                                    cluster=n.cluster, at=n.at, error=n.error)
                        for n in tally.failures.values()
                    )  # fmt: skip
        return out

    def with_observations(self, observations: Iterable[Observation]) -> EvidenceIndex:
        """A new index with ``observations`` folded in; this one is unchanged (a copy:
        for tests and previews, not for the service's reports)."""
        new = EvidenceIndex(
            self.counted(),
            min_samples=self.min_samples,
            min_pods=self.min_pods,
            failure_policy=self.failure_policy,
            per_pod=self.per_pod,
        )
        new.add(observations)
        return new


EMPTY = EvidenceIndex().freeze()
"""No evidence: what the agent's local fallback and a preview without a store use."""
