"""Evidence read in bulk (a replica's full reload, a new scope's index): each pod's
record bounded as it is read, then filed once into every index that trusts its cluster,
the TFLOP/s sorted in pieces, an index that takes exactly another's pods copied."""

from __future__ import annotations

import heapq
import math
import sys
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from mla_switchboard.core.evidence.index import EvidenceIndex
from mla_switchboard.core.evidence.observations import Observation, backend_of
from mla_switchboard.core.evidence.records import (
    IMPLS_OF,
    RECORD,
    SAMPLE_SIZE,
    SAMPLES_PER_POD,
    TIME,
    VALUES_OF,
    Record,
    expiry_entry,
    expiry_time,
    failure_key,
    impl_id_of,
    record_oldest_dated,
    sample_key,
    with_sample,
)
from mla_switchboard.core.evidence.situations import Situation
from mla_switchboard.core.evidence.tallies import ALL, LOAD_STEP
from mla_switchboard.core.evidence.values import PIECE, sorted_in_pieces
from mla_switchboard.core.specs import Backend
from mla_switchboard.core.stages import pod_key

__all__ = ["EvidenceLoader", "LoadedSample"]

_MISSING: Any = object()


class _Filling:
    """One empty tally that :meth:`EvidenceLoader.build` fills: its pods are filed as
    they come, its TFLOP/s and impls gathered and counted once at the end."""

    __slots__ = ("impls", "index", "last", "pods", "tally", "values")

    def __init__(self, index: EvidenceIndex, situation: Situation, backend: Backend) -> None:
        self.index = index
        self.tally = index._tally(situation, backend)
        if not self.tally.empty():
            raise ValueError("a loader fills empty indexes only")
        # arrays, not lists: nothing in them for a young collection to visit (one over
        # 200,000 floats gathered here took 14 ms)
        self.values = array("d")
        self.impls = array("H")
        self.pods = 0
        self.last: dict[int | None, float] = {}  # each bucket's newest sample so far

    def finish(self, pause: Callable[[], None], newest: Callable[[str], float]) -> None:
        """Sort, count and order what was filed, in pieces: one call over 200,000
        values (a Counter of them) held the interpreter 10 ms."""
        tally = self.tally
        tally.pods = self.pods
        tally.values = sorted_in_pieces(self.values, pause)
        step = PIECE
        for start in range(0, len(self.impls), step):
            tally.impls.update(self.impls[start : start + step])
            pause()
        tally.impls.pop(0, None)
        tally.order(pause, newest)
        tally.settle()
        if tally.expiry:
            self.index._earliest = min(self.index._earliest, expiry_time(tally.expiry[0]))
        self.values, self.impls, self.last = array("d"), array("H"), {}

    def copy(self, source: _Filling, pause: Callable[[], None]) -> None:
        """The same pods as ``source`` (finished): its records and heap entries shared,
        its dicts and sorted values copied in C, a bucket a step."""
        tally, done = self.tally, source.tally
        for bucket, pods in done.buckets.items():
            tally.buckets[bucket] = dict(pods)
        tally.split = done.split
        pause()
        tally.disordered = set(done.disordered)
        tally.expiry = list(done.expiry)
        tally.pods = done.pods
        tally.values = done.values.copy()
        tally.impls = Counter(done.impls)
        if tally.expiry:
            self.index._earliest = min(self.index._earliest, expiry_time(tally.expiry[0]))
        pause()


LoadedSample = tuple[Situation, str, str, str, float, float, str | None, str]
"""One counted result as a full read hands it over, without an ``Observation``:
(situation, backend, cluster, pod, time key, TFLOP/s, impl, report id). The report id
is for the reader's own bookkeeping; the loader ignores it."""


class EvidenceLoader:
    """Evidence read in bulk (a replica's full reload, a new scope's index), built into
    one or several empty indexes at once, in linear time and small steps.

    Rows are kept as each pod's record, bounded as an index bounds it (the ``per_pod``
    most recent results, a failing pod's newest failure), so what a long history costs
    here is the time to read it, never memory: the loader holds what counts and no
    more. :meth:`build` then files every pod of every situation and backend into the
    indexes that trust its cluster, sharing the pod's record between them, and sorts
    each index's TFLOP/s once (in pieces) instead of inserting them one by one."""

    def __init__(self, per_pod: int = SAMPLES_PER_POD) -> None:
        self.per_pod = per_pod
        self._records: dict[tuple[Situation, Backend], dict[str, Record]] = {}
        self._known: dict[tuple[Situation, str], dict[str, Record] | None] = {}
        self._failures: dict[tuple[Situation, str, str], Observation] = {}

    def _records_of(self, situation: Situation, backend: str) -> dict[str, Record] | None:
        found = self._known.get((situation, backend), _MISSING)
        if found is _MISSING:
            known = backend_of(backend)
            found = None if known is None else self._records.setdefault((situation, known), {})
            self._known[(situation, backend)] = found
        return found  # type: ignore[no-any-return]

    def add_samples(self, samples: Iterable[LoadedSample]) -> None:
        """Counted results (see :data:`LoadedSample`), in any order."""
        per_pod, pack, time_at = self.per_pod, RECORD.pack, TIME.unpack_from
        full = per_pod * SAMPLE_SIZE
        known: dict[tuple[int, str], dict[str, Record] | None] = {}  # by the object: a
        # read's rows share one Situation each, and comparing equal ones cost 0.5 us
        impls: dict[str | None, int] = {}
        for situation, backend, cluster, pod, at, tflops, impl, _ in samples:
            records = known.get((id(situation), backend), _MISSING)
            if records is _MISSING:
                records = known[(id(situation), backend)] = self._records_of(situation, backend)
            if records is None or tflops is None or tflops != tflops:  # NaN counts nowhere
                continue
            impl_id = impls.get(impl)
            if impl_id is None:
                impl_id = impls[impl] = impl_id_of(impl)
            key = f"{cluster}\0{pod}"
            sample = pack(at, tflops, impl_id)
            record = records.get(key)
            if record is None:  # interned: one string per pod for all its groups
                records[sys.intern(key)] = sample
            elif at >= time_at(record, len(record) - SAMPLE_SIZE)[0]:  # newer than all: the usual
                record += sample
                records[key] = record[SAMPLE_SIZE:] if len(record) > full else record
            else:
                changed = with_sample(record, sample, at, per_pod)
                if changed is not None:
                    records[key] = changed[0]

    def add(self, observations: Iterable[Observation]) -> None:
        """Observations: results as :meth:`add_samples`, a pod's newest failure kept."""
        for o in observations:
            if o.ok:
                if o.tflops is not None:
                    sample = (o.situation, o.backend, o.cluster, o.pod, sample_key(o.at),
                              float(o.tflops), o.impl, "")  # fmt: skip
                    self.add_samples((sample,))
                continue
            if self._records_of(o.situation, o.backend) is None:
                continue
            slot = (o.situation, o.backend, pod_key(o.cluster, o.pod))
            known = self._failures.get(slot)
            if known is None or failure_key(o.at) >= failure_key(known.at):
                self._failures[slot] = o

    def groups(self) -> Iterator[tuple[Situation, str, dict[str, Record]]]:
        """What counts so far, per situation and backend (its registry name): the
        pods' records by pod key, as a snapshot keeps them (``snapshot.py``)."""
        for (situation, backend), records in self._records.items():
            yield situation, backend.value, records

    def restore(self, groups: Iterable[tuple[Situation, str, dict[str, Record]]]) -> int:
        """Start from a snapshot's groups (before any row is added: the rows after the
        snapshot then come on top, as they would have on a full read); the pods
        restored. A backend this registry no longer knows is left out."""
        if any(self._records.values()) or self._failures:
            raise ValueError("a loader restores a snapshot before anything else")
        merges: list[tuple[dict[str, Record], dict[str, Record]]] = []
        for situation, backend, records in groups:
            known = backend_of(backend)
            if known is None:
                continue
            into = self._records.get((situation, known))
            if into is not None:  # merged at the end, whole (see below)
                merges.append((into, records))
            else:  # adopted, not copied: a snapshot's dicts are the loader's own
                self._records[(situation, known)] = records
                self._known[(situation, backend)] = records
        # a group's dict may still be filled after it was handed over
        # (``snapshot.decode_parts``): merged and counted once the groups are done
        for into, records in merges:
            into.update(records)
        return sum(len(records) for records in self._records.values())

    def clear(self) -> None:
        """Back to empty (a snapshot that turned out damaged halfway through)."""
        self._records.clear()
        self._known.clear()
        self._failures.clear()

    def add_index(self, index: EvidenceIndex) -> None:
        """Everything ``index`` counts (its pods' records are shared, not copied)."""
        with index._lock:
            for situation, tallies in index._tallies.items():
                for backend, tally in tallies.items():
                    records = self._records.setdefault((situation, backend), {})
                    self._known[(situation, backend.value)] = records
                    for key, record in tally.records():
                        known = records.get(key)
                        if known is None:
                            records[key] = record
                        else:  # the same pod from two indexes: merge sample by sample
                            for sample in RECORD.iter_unpack(record):
                                changed = with_sample(
                                    known, RECORD.pack(*sample), sample[0], self.per_pod
                                )
                                if changed is not None:
                                    known = changed[0]
                            records[key] = known
                    for note in tally.failures.values():
                        self.add([Observation(situation, backend.value, note.pod, None,
                                              ok=False, cluster=note.cluster, at=note.at,
                                              error=note.error)])  # fmt: skip

    def build(
        self,
        targets: Callable[[str], Sequence[EvidenceIndex]],
        pause: Callable[[], None] = lambda: None,
    ) -> None:
        """File everything into ``targets(cluster)``, the empty indexes that take that
        cluster's evidence, calling ``pause`` between steps of a few milliseconds (the
        indexes are the caller's alone until it publishes them). The loader is spent:
        each situation and backend's pods are let go of once filed, so that the
        indexes never coexist with a whole second set of dicts (at 400,000 pod
        records, 20 MB of a start's peak); its failures stay."""
        chosen: dict[str, Sequence[EvidenceIndex]] = {}

        def of(cluster: str) -> Sequence[EvidenceIndex]:
            found = chosen.get(cluster)
            if found is None:
                found = chosen[cluster] = targets(cluster)
                for index in found:
                    if index.per_pod != self.per_pod:
                        raise ValueError("a loader fills indexes of its own per_pod only")
            return found

        keys: dict[str, str] = {}  # a pod's key, interned: one string for its backends
        filed = 0
        for group in list(self._records):
            situation, backend = group
            records = self._records[group]
            # An index that takes every cluster present here (all clusters, and a
            # situation seen in one cluster only: its cluster's too) gets the same pods
            # as the first such one: that one is filled, the others copy it.
            present = {key.partition("\0")[0] for key in records}
            takers, copies = _takers(present, of)
            filling = {i: _Filling(index, situation, backend) for i, index in takers.items()}
            by_cluster = {
                cluster: [filling[id(i)] for i in of(cluster) if id(i) not in copies]
                for cluster in present
            }
            newest_of: dict[str, float] = {}  # what a disordered bucket is sorted by
            for key, record in records.items():
                fills = by_cluster[key.partition("\0")[0]]
                if not fills:
                    continue
                known = keys.get(key)  # once for all a pod's backends
                key = keys[key] = sys.intern(key) if known is None else known
                n = len(record) // SAMPLE_SIZE
                values, impls = VALUES_OF[n].unpack(record), IMPLS_OF[n].unpack(record)
                newest = newest_of[key] = TIME.unpack_from(record, len(record) - SAMPLE_SIZE)[0]
                oldest = TIME.unpack_from(record)[0]
                if oldest == -math.inf:  # undated samples come first
                    oldest = record_oldest_dated(record)
                entry = expiry_entry(oldest, key) if oldest != math.inf else b""  # shared too
                for fill in fills:
                    tally = fill.tally  # filled as one dict: ``finish`` splits a big one
                    pods = tally.buckets.get(ALL)
                    if pods is None:
                        pods = tally.buckets[ALL] = {}
                    if newest >= fill.last.get(ALL, -math.inf):
                        fill.last[ALL] = newest
                    else:
                        tally.disordered.add(ALL)
                    pods[key] = record
                    if entry:
                        heapq.heappush(tally.expiry, entry)
                    fill.values.extend(values)
                    fill.impls.extend(impls)  # 0: no impl named (the count drops it)
                    fill.pods += 1
                filed += 1
                if filed % LOAD_STEP == 0:
                    pause()
            for i, fill in filling.items():
                if i not in copies:
                    fill.finish(pause, newest_of.__getitem__)
            for i, source in copies.items():
                filling[i].copy(filling[source], pause)
            del self._records[group], records, newest_of, by_cluster, filling
            self._known.pop((situation, backend.value), None)
        self._file_failures(of)
        _publish_filled(chosen, pause)

    def _file_failures(self, of: Callable[[str], Sequence[EvidenceIndex]]) -> None:
        """The failures read, into every index that takes their cluster."""
        failing: dict[int, tuple[EvidenceIndex, list[Observation]]] = {}
        for o in self._failures.values():  # in the order read (ties in time keep it)
            for index in of(o.cluster):
                failing.setdefault(id(index), (index, []))[1].append(o)
        for index, failures in failing.values():
            index.add(failures)


def _takers(
    present: set[str], of: Callable[[str], Sequence[EvidenceIndex]]
) -> tuple[dict[int, EvidenceIndex], dict[int, int]]:
    """The indexes that take any of the ``present`` clusters (by id), and which of them
    copy another: those that take every present cluster hold the same pods, so only the
    first is filled."""
    takers: dict[int, EvidenceIndex] = {}
    takes: dict[int, int] = {}
    for cluster in present:
        for index in of(cluster):
            takers[id(index)] = index
            takes[id(index)] = takes.get(id(index), 0) + 1
    every = [i for i, n in takes.items() if n == len(present)]
    return takers, {i: every[0] for i in every[1:]}


def _publish_filled(
    chosen: Mapping[str, Sequence[EvidenceIndex]], pause: Callable[[], None]
) -> None:
    """Publish every filled index's summaries, one index per step."""
    filled = {id(index): index for indexes in chosen.values() for index in indexes}
    for index in filled.values():
        with index._lock:
            index._publish({s: list(tallies) for s, tallies in index._tallies.items()})
        pause()
