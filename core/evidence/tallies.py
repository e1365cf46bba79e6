"""One backend in one situation as an index's writer keeps it (:class:`Tally`): pods by
stage bucket in the order of their newest sample, an expiry heap, the sorted TFLOP/s."""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from mla_switchboard.core.evidence.observations import FailureNote
from mla_switchboard.core.evidence.records import (
    IMPL_NAMES,
    RECORD,
    Record,
    expiry_entry,
    expiry_key,
    expiry_time,
    failure_key,
    record_newest,
    record_oldest_dated,
    split_expired,
    split_key,
    with_sample,
)
from mla_switchboard.core.evidence.stats import BackendStats, PodSample
from mla_switchboard.core.evidence.values import median
from mla_switchboard.core.stages import pod_key, stage_bucket_of_key
from sortedcontainers import SortedList

LOAD_STEP = 2000
"""Pods a bulk load files between two pauses."""

SPLIT_AT = 256
"""Pods a tally holds in one dict before it keeps one per stage bucket. A cluster's
index holds a tally per situation and backend: a hundred pods over a hundred bucket
dicts cost more memory than the pods themselves, while a guard's read of one
dict of a few hundred pods, filtered by bucket, costs a fraction of a millisecond."""

ALL = -1
"""The one dict's key while a tally is small (stage buckets are 0-99 or None)."""


class Tally:
    """One backend in one situation, as the index's writer changes it.

    **Pods by stage bucket, in the order of their newest sample.** ``buckets`` maps
    each stage bucket (``core/stages.py``) to its pods' records, a dict kept in the
    order of each pod's newest sample: a pod whose newest sample moves is deleted and
    inserted again (O(1)), so a pod's report costs the same whatever the number of
    pods (before, each one copied its bucket's order, a hundredth of the situation:
    quadratic in pods). A rollout guard reads its stage's buckets from the newest
    end back to the stage's start, and never walks (or hashes) the rest of the
    situation's history. A sample older than its bucket's newest (a late report) marks
    the bucket ``disordered``; the next read that walks it sorts it first (1% of the
    situation's pods). A tally of at most ``SPLIT_AT`` pods keeps them all in one dict
    (``ALL``), in the same order, and filters by bucket as it reads: memory follows what
    a cluster has, not the hundred buckets (``split`` once it grows past that).

    **Expiry** is a heap of (time key, pod) entries (``expiry_entry``: bytes that sort as
    the time): each pod with a dated sample has an entry no later than its oldest
    dated sample (a newer one is added when an older sample arrives; one whose pod
    moved on is corrected when it comes up). A prune pops only the entries older than
    its cutoff: what expired, not every pod.

    Every counted TFLOP/s is also in ``values``, kept sorted (``values.py``), so the
    median is a lookup and a new sample costs a binary search and a short move.

    **Nothing here costs the garbage collector.** A pod is a string key and an
    immutable ``bytes`` record in dicts that hold nothing else (CPython does not track
    those), and a heap entry is bytes too: a replica holding 100,000 pods' samples
    gives each collection a few objects per tally."""

    __slots__ = (
        "_failures_newest_first",
        "buckets",
        "disordered",
        "expiry",
        "failures",
        "impls",
        "pods",
        "split",
        "values",
    )

    def __init__(self) -> None:
        self.buckets: dict[int | None, dict[str, Record]] = {}
        self.disordered: set[int | None] = set()
        self.expiry: list[bytes] = []  # a heap of expiry_entry(time, pod) entries
        self.pods = 0
        self.split = False  # one dict per stage bucket (else all pods under ALL)
        self.values = SortedList()
        self.impls: Counter[int] = Counter()
        self.failures: dict[str, FailureNote] = {}
        self._failures_newest_first: tuple[FailureNote, ...] | None = ()

    # ------------------------------------------------------------- samples

    def home(self, bucket: int | None) -> int | None:
        """The key of the dict that holds a pod of ``bucket``."""
        return bucket if self.split else ALL

    def record(self, key: str, bucket: int | None) -> Record | None:
        pods = self.buckets.get(self.home(bucket))
        return None if pods is None else pods.get(key)

    def settle(self) -> None:
        """One dict per stage bucket once the tally has grown past ``SPLIT_AT`` pods
        (each keeps the order it had in the one dict)."""
        if self.split or self.pods <= SPLIT_AT:
            return
        pods = self._ordered(ALL) or {}
        buckets: dict[int | None, dict[str, Record]] = {}
        for key, record in pods.items():
            bucket = stage_bucket_of_key(key)
            into = buckets.get(bucket)
            if into is None:
                into = buckets[bucket] = {}
            into[key] = record
        self.buckets, self.split = buckets, True

    def records(self) -> Iterator[tuple[str, Record]]:
        for pods in self.buckets.values():
            yield from pods.items()

    def add_sample(
        self, key: str, bucket: int | None, at: float, value: float, impl: int, per_pod: int
    ) -> bool:
        sample = RECORD.pack(at, value, impl)
        bucket = self.home(bucket)
        pods = self.buckets.get(bucket)
        if pods is None:
            pods = self.buckets[bucket] = {}
        record = pods.get(key)
        if record is None:
            self._place(pods, bucket, key, sample, at)
            self.pods += 1
            self._count(value, impl)
            if at != -math.inf:
                heapq.heappush(self.expiry, expiry_entry(at, key))
            if self.pods > SPLIT_AT and not self.split:
                self.settle()
            return True
        changed = with_sample(record, sample, at, per_pod)
        if changed is None:
            return False
        new, made_room = changed
        self._count(value, impl)
        if made_room is not None:
            _, old_value, old_impl = RECORD.unpack(made_room)
            self._uncount(old_value, old_impl)
        if at > record_newest(record):  # its place in its bucket's order
            del pods[key]
            self._place(pods, bucket, key, new, at)
        else:
            pods[key] = new
        if at != -math.inf and at < record_oldest_dated(record):
            heapq.heappush(self.expiry, expiry_entry(at, key))  # expires before the pod's entry
        return True

    def _place(
        self, pods: dict[str, Record], bucket: int | None, key: str, record: Record, newest: float
    ) -> None:
        """Put ``record`` last in its bucket (noting when that breaks the order)."""
        last = pods[next(reversed(pods))] if pods else None
        if last is not None and bucket not in self.disordered and newest < record_newest(last):
            self.disordered.add(bucket)
        pods[key] = record

    def _ordered(
        self, bucket: int | None, newest: Callable[[str], float] | None = None
    ) -> dict[str, Record] | None:
        """A bucket's pods, sorted first if a late report disordered them (``newest``:
        each pod's newest time by its key, when the caller knows them already)."""
        pods = self.buckets.get(bucket)
        if pods is not None and bucket in self.disordered:
            by_time = sorted(pods, key=newest or (lambda key: record_newest(pods[key])))
            ordered = {key: pods[key] for key in by_time}
            pods.clear()
            pods.update(ordered)
            self.disordered.discard(bucket)
        return pods

    def order(self, pause: Callable[[], None], newest: Callable[[str], float]) -> None:
        """Sort every disordered bucket (after a bulk load), a few thousand pods a step."""
        sorted_since = 0
        for bucket in list(self.disordered):
            sorted_since += len(self._ordered(bucket, newest) or ())
            if sorted_since >= LOAD_STEP:
                sorted_since = 0
                pause()

    def in_buckets(self, buckets: Iterable[int | None], since: float) -> list[PodSample]:
        """The samples at or after ``since`` (a time key) of the pods in ``buckets``."""
        out: list[PodSample] = []
        wanted = None if self.split else set(buckets)
        for bucket in (ALL,) if wanted is not None else buckets:
            pods = self._ordered(bucket)
            if not pods:
                continue
            recent: list[tuple[str, Record]] = []
            for key, record in reversed(pods.items()):
                if record_newest(record) < since:
                    break
                if wanted is None or stage_bucket_of_key(key) in wanted:
                    recent.append((key, record))
            for key, record in reversed(recent):
                cluster, pod = split_key(key)
                out.extend(
                    (cluster, pod, value)
                    for at, value, _ in RECORD.iter_unpack(record)
                    if at >= since
                )
        return out

    def _count(self, value: float, impl: int) -> None:
        self.values.add(value)
        if impl:
            self.impls[impl] += 1

    def _uncount(self, value: float, impl: int) -> None:
        self.values.remove(value)
        if impl:
            self.impls[impl] -= 1
            if self.impls[impl] <= 0:
                del self.impls[impl]

    # ------------------------------------------------------------- failures

    def add_failure(self, key: str, note: FailureNote) -> bool:
        known = self.failures.get(key)
        if known is not None and failure_key(note.at) < failure_key(known.at):
            return False  # a pod counts once, with its newest note
        self.failures[key] = note
        self._failures_newest_first = None
        return True

    def clear_failures(self, cutoff: float) -> bool:
        """Forget failures noted at or before ``cutoff`` (a time key; undated ones too)."""
        gone = [
            key
            for key, note in self.failures.items()
            if note.at is None or note.at.timestamp() <= cutoff
        ]
        for key in gone:
            del self.failures[key]
        if gone:
            self._failures_newest_first = None
        return bool(gone)

    def failures_newest_first(self) -> tuple[FailureNote, ...]:
        if self._failures_newest_first is None:
            self._failures_newest_first = tuple(
                sorted(self.failures.values(), key=lambda f: failure_key(f.at), reverse=True)
            )
        return self._failures_newest_first

    # --------------------------------------------------------------- expiry

    def earliest(self) -> float:
        """The oldest dated sample or failure (inf: nothing can expire)."""
        earliest = expiry_time(self.expiry[0]) if self.expiry else math.inf
        notes = self.failures_newest_first()
        if notes and notes[-1].at is not None:
            earliest = min(earliest, notes[-1].at.timestamp())
        return earliest

    def next_lapse(self, now: float, window: float) -> float:
        """When a failure next leaves the failure policy's window (inf: none will)."""
        notes = self.failures_newest_first()
        # the notes newer than now - window are a prefix: its last one lapses first
        newer = bisect.bisect_left(notes, window - now, key=lambda f: -failure_key(f.at))
        if newer == 0:
            return math.inf
        return failure_key(notes[newer - 1].at) + window

    def prune(self, cutoff: float, budget: int, handled: dict[str, float]) -> tuple[bool, int]:
        """Drop at most about ``budget`` entries' worth of what is older than ``cutoff``:
        (anything changed, entries looked at). ``handled`` (pod -> the entry it was
        given) lasts one prune, so a pod's extra entries are dropped, not repeated."""
        changed, used = False, 0
        expiry, due = self.expiry, expiry_entry(cutoff, "")  # entries before it are due
        while expiry and expiry[0] < due and used < budget:
            key = expiry_key(heapq.heappop(expiry))
            used += 1
            bucket = self.home(stage_bucket_of_key(key))
            pods = self.buckets.get(bucket)
            record = None if pods is None else pods.get(key)
            if pods is None or record is None:
                continue  # the pod is gone already
            kept, expired = split_expired(record, cutoff)
            if expired:
                changed = True
                for _, value, impl in RECORD.iter_unpack(expired):
                    self._uncount(value, impl)
                if not kept:
                    del pods[key]
                    self.pods -= 1
                    if not pods:
                        del self.buckets[bucket]
                        self.disordered.discard(bucket)
                    continue
                if record_newest(kept) != record_newest(record):  # only undated samples are left
                    del pods[key]
                    self._place(pods, bucket, key, kept, record_newest(kept))
                else:
                    pods[key] = kept
            oldest = record_oldest_dated(kept)
            if oldest != math.inf and handled.get(key) != oldest:
                handled[key] = oldest
                heapq.heappush(expiry, expiry_entry(oldest, key))
        if self.failures and used < budget:
            notes = self.failures_newest_first()
            keep = len(notes)
            while keep and failure_key(notes[keep - 1].at) < cutoff and used < budget:
                keep -= 1
                used += 1
                del self.failures[pod_key(notes[keep].cluster, notes[keep].pod)]
            if keep < len(notes):
                self._failures_newest_first = notes[:keep]
                changed = True
        return changed, used

    def due(self, cutoff: float) -> bool:
        return self.earliest() < cutoff

    def empty(self) -> bool:
        return not self.pods and not self.failures

    def stats(self) -> BackendStats:
        return BackendStats(
            median_tflops=median(self.values),
            samples=len(self.values),
            pods=self.pods,
            impls=frozenset(IMPL_NAMES[i] for i in self.impls),  # type: ignore[misc]
            failures=self.failures_newest_first(),
        )
