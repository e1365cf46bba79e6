"""Measured selection: the fleet's own benchmarks and failures, per exact situation.

A *situation* is what decides which kernel is fastest and whether it works: device
name, compute capability, MLA dims, dtype, the versions of the kernel packages and the
serving engine (vLLM's FLASH_ATTN is vLLM's bundled FlashAttention 3, not the FA2 that
PyTorch bundles, so the two are never compared as one). Evidence counts only for its
own situation.

Failures (a kernel that failed to build, or gave a wrong result) exclude a backend
under a stated :class:`FailurePolicy`: by default one failing pod within 24 hours. They
expire with the window and an admin can clear them; every exclusion is a reason the
answer shows ("failed on 2 pods in the last 24 h: staging/pod-a 2026-11-30 15:37 UTC:
..."), never a silent gap.

**What counts is bounded.** Per situation, backend and pod (cluster and pod name) only
the ``per_pod`` most recent correct results count (:data:`SAMPLES_PER_POD`, 8 by
default; the service reads ``SWITCHBOARD_MEASURED_SAMPLES_PER_POD``), and a failing pod
counts once, with its newest failure. A pod that benchmarks at every boot for a month
therefore weighs as much as one that booted twice this week, and memory and ranking
cost follow the number of pods, not the history. A pod's older results make room for
newer ones; results older than the evidence window are dropped by
:meth:`EvidenceIndex.prune`.

An :class:`EvidenceIndex` changes in place: adding an observation costs a binary search
and a memmove in a sorted list (never a copy of the samples), and a write publishes
immutable per-situation summaries (:class:`BackendStats`) with one assignment, which
readers use without a lock. :meth:`EvidenceIndex.with_observations` still gives a new
index, by copying (for tests and one-off comparisons).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import sys
import threading
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from mla_switchboard.core.engines import OWN_ENGINE
from mla_switchboard.core.schemas import EngineInfo, Evidence, MeasurementReport, SelectRequest
from mla_switchboard.core.specs import KERNEL_PACKAGES as _PACKAGES
from mla_switchboard.core.specs import Backend, format_capability
from mla_switchboard.core.stages import stage_bucket

__all__ = [
    "KERNEL_PACKAGES",
    "SAMPLES_PER_POD",
    "BackendStats",
    "EvidenceIndex",
    "FailureNote",
    "FailurePolicy",
    "Observation",
    "PodSample",
    "Situation",
    "dims_key",
    "engine_key",
    "failure_observation",
    "observations_of_report",
    "packages_key",
    "report_key",
    "situation_of",
]

KERNEL_PACKAGES: tuple[str, ...] = tuple(_PACKAGES)
"""Only the packages some backend needs or uses (``core/specs.py``) change kernel speed;
others' versions don't split the evidence."""

SAMPLES_PER_POD = 8
"""How many of a pod's most recent results count per situation and backend."""


@dataclass(frozen=True, order=True)
class Situation:
    """One situation's key, field by field as the store keeps it (a row's columns give
    one back as they are); :meth:`of` builds one from what a pod or an admin says."""

    device: str
    capability: str  # format_capability(): "9.0"
    dims: str  # dims_key(): "128,64,128"
    dtype: str
    packages: str  # canonical JSON of the kernel packages' versions
    engine: str = OWN_ENGINE  # engine_key(): "switchboard" or "vllm 0.33.0"

    @classmethod
    def of(
        cls,
        *,
        device: str | None,
        capability: Sequence[int] | str,
        dims: Sequence[int],
        dtype: str,
        packages: Mapping[str, str],
        engine: EngineInfo | str | None,
    ) -> Situation:
        """The situation of a request, a measurement report or a failure clear: every
        part written by the one key function for it, so the three meet on one key.
        ``capability`` and ``engine`` may be given as keys already (``"9.0"``, a clear's
        ``"vllm 0.33.0"``)."""
        return cls(
            device=device or "",
            capability=capability if isinstance(capability, str) else format_capability(capability),
            dims=dims_key(*dims),
            dtype=dtype,
            packages=packages_key(packages),
            engine=engine if isinstance(engine, str) else engine_key(engine),
        )


def packages_key(packages: Mapping[str, str]) -> str:
    return json.dumps(
        {k: packages[k] for k in KERNEL_PACKAGES if k in packages},
        sort_keys=True,
        separators=(",", ":"),
    )


def dims_key(qk_nope: int, qk_rope: int, v: int) -> str:
    return f"{qk_nope},{qk_rope},{v}"


def engine_key(engine: EngineInfo | None) -> str:
    """The engine part of a situation: its name and exact version (a code path can
    change between releases), ``switchboard`` for our own wrappers."""
    if engine is None or engine.name == OWN_ENGINE:
        return OWN_ENGINE
    return f"{engine.name} {engine.version or '?'}"


def situation_of(request: SelectRequest) -> Situation | None:
    """None when the request cannot be matched exactly: no GPU, or packages unknown."""
    cap = request.device.capability
    if cap is None or request.packages is None:
        return None
    return _situation(request, cap, request.packages)


def _situation(
    source: SelectRequest | MeasurementReport, cap: Sequence[int], packages: Mapping[str, str]
) -> Situation:
    """The situation a request or a report is about (both say it in the same fields)."""
    m = source.model
    return Situation.of(
        device=source.device.name,
        capability=cap,
        dims=(m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
        dtype=source.dtype.value,
        packages=packages,
        engine=source.engine,
    )


@dataclass(frozen=True)
class Observation:
    """One measured result or one reported failure, already keyed by situation."""

    situation: Situation
    backend: str
    pod: str
    tflops: float | None
    ok: bool
    cluster: str = ""
    at: datetime | None = None
    error: str | None = None
    impl: str | None = None
    source: str = ""  # the stored report it comes from, so a reload can tell it apart


@dataclass(frozen=True)
class FailureNote:
    """One failing pod's report, as an exclusion reason quotes it."""

    cluster: str
    pod: str
    at: datetime | None
    error: str

    def describe(self) -> str:
        where = f"{self.cluster}/{self.pod}" if self.cluster else (self.pod or "a pod")
        when = (
            "" if self.at is None else " " + self.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
        )
        first_line = (self.error.strip().splitlines() or ["no error text"])[0][:200]
        return f"{where}{when}: {first_line}"


@dataclass(frozen=True)
class FailurePolicy:
    """When failures exclude a backend from measured selection.

    A backend is excluded for a situation while at least ``min_pods`` distinct pods
    reported a failure (failed build or wrong result) within the last ``window``.
    Older failures expire by themselves; an admin can clear a situation's failures.
    """

    min_pods: int = 1
    window: timedelta = timedelta(hours=24)

    def describe(self) -> str:
        hours = self.window.total_seconds() / 3600
        pods = "1 pod" if self.min_pods == 1 else f"{self.min_pods} pods"
        return f"failures from at least {pods} within {hours:g} h exclude a backend"

    def exclusion(self, failures: Sequence[FailureNote], now: datetime) -> str | None:
        """The reason ``failures`` (any notes, several per pod allowed) exclude their
        backend at ``now``, or None."""
        latest: dict[tuple[str, str], FailureNote] = {}
        for f in failures:
            known = latest.get((f.cluster, f.pod))
            if known is None or _failure_key(f.at) >= _failure_key(known.at):
                latest[(f.cluster, f.pod)] = f
        newest_first = sorted(latest.values(), key=lambda f: _failure_key(f.at), reverse=True)
        return self.exclusion_of_latest(newest_first, now)

    def exclusion_of_latest(self, latest: Sequence[FailureNote], now: datetime) -> str | None:
        """As :meth:`exclusion`, for one note per pod, newest first (what
        :attr:`BackendStats.failures` holds): a binary search finds the pods within the
        window, so a decision never walks every failing pod."""
        since = -(now - self.window).timestamp()
        recent = bisect.bisect_right(latest, since, key=lambda f: -_failure_key(f.at))
        if recent == 0 or recent < self.min_pods:
            return None
        shown = "; ".join(n.describe() for n in latest[: min(recent, 3)])
        more = "" if recent <= 3 else f"; and {recent - 3} more"
        hours = self.window.total_seconds() / 3600
        pods = "1 pod" if recent == 1 else f"{recent} pods"
        return f"failed on {pods} in the last {hours:g} h (measured policy): {shown}{more}"


def _sample_key(at: datetime | None) -> float:
    """A sample's place in its pod's history: one without a time is the oldest (the
    first to make room) and never expires."""
    return -math.inf if at is None else at.timestamp()


def _failure_key(at: datetime | None) -> float:
    """A failure note's age: one without a time is the newest and never expires, as
    the failure policy has always read it."""
    return math.inf if at is None else at.timestamp()


@dataclass(frozen=True)
class BackendStats:
    """What the fleet measured for one backend in one situation: a summary that a
    write to the index publishes and nothing changes afterwards.

    ``samples`` and ``pods`` count only what counts (each pod's ``per_pod`` most recent
    correct results); ``failures`` holds each failing pod's newest note, newest first.
    """

    median_tflops: float | None = None
    samples: int = 0
    pods: int = 0
    impls: frozenset[str] = frozenset()
    failures: tuple[FailureNote, ...] = ()


Group = Mapping[Backend, BackendStats]
Sample = tuple[float, float, str | None]
"""(time key, TFLOP/s, impl) of one counted result"""
PodKey = tuple[str, str]
"""(cluster, pod)"""
PodSample = tuple[str, str, float]
"""(cluster, pod, TFLOP/s) of one counted sample"""


_NO_GROUP: Group = MappingProxyType({})


class _SortedFloats:
    """A sorted multiset of floats, in chunks of ``CHUNK`` to ``2 * CHUNK`` items.

    An insertion or removal is a binary search and a memmove within one chunk, so its
    cost does not grow with the number of samples (one flat sorted list moved half of
    them each time); the median walks the chunks' lengths. A chunk is an ``array('d')``:
    8 bytes a value instead of a float object and its pointer, and nothing inside it
    for the garbage collector to visit."""

    CHUNK = 256
    __slots__ = ("_chunks", "_len", "_maxes")

    def __init__(self) -> None:
        self._chunks: list[array[float]] = []
        self._maxes: list[float] = []  # each chunk's largest item, for the binary search
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[float]:
        for chunk in self._chunks:
            yield from chunk

    def add(self, value: float) -> None:
        self._len += 1
        if not self._chunks:
            self._chunks.append(array("d", (value,)))
            self._maxes.append(value)
            return
        i = min(bisect.bisect_left(self._maxes, value), len(self._maxes) - 1)
        chunk = self._chunks[i]
        bisect.insort(chunk, value)
        self._maxes[i] = chunk[-1]
        if len(chunk) > 2 * self.CHUNK:
            upper = chunk[self.CHUNK :]
            del chunk[self.CHUNK :]
            self._chunks.insert(i + 1, upper)
            self._maxes[i] = chunk[-1]
            self._maxes.insert(i + 1, upper[-1])

    def remove(self, value: float) -> None:
        """Remove one item equal to ``value`` (which must be there)."""
        i = bisect.bisect_left(self._maxes, value)
        chunk = self._chunks[i]
        del chunk[bisect.bisect_left(chunk, value)]
        self._len -= 1
        if not chunk:
            del self._chunks[i]
            del self._maxes[i]
            return
        self._maxes[i] = chunk[-1]
        if len(chunk) < self.CHUNK // 2 and len(self._chunks) > 1:
            self._merge(min(i, len(self._chunks) - 2))

    def _merge(self, i: int) -> None:
        """Join chunk ``i`` with the next one (split again when too large)."""
        merged = self._chunks[i] + self._chunks[i + 1]
        del self._chunks[i + 1], self._maxes[i + 1]
        if len(merged) > 2 * self.CHUNK:
            half = len(merged) // 2
            self._chunks[i : i + 1] = [merged[:half], merged[half:]]
            self._maxes[i : i + 1] = [merged[half - 1], merged[-1]]
        else:
            self._chunks[i] = merged
            self._maxes[i] = merged[-1]

    def __getitem__(self, k: int) -> float:
        for chunk in self._chunks:
            if k < len(chunk):
                return chunk[k]
            k -= len(chunk)
        raise IndexError(k)

    def median(self) -> float | None:
        n = self._len
        if n == 0:
            return None
        mid = n // 2
        return self[mid] if n % 2 else (self[mid - 1] + self[mid]) / 2


PodSamples = tuple[Sample, ...]
"""One pod's counted samples, oldest first (at most ``per_pod``)."""
Ordered = tuple[tuple[float, ...], tuple[PodKey, ...]]
"""One stage bucket's pods by the time key of their newest sample, oldest first: the
times and the pods as two parallel tuples, so a binary search compares floats only."""
_NONE_ORDERED: Ordered = ((), ())


def _moved(entries: Ordered, pod: PodKey, was: float | None, now: float | None) -> Ordered:
    """``entries`` with ``pod``'s newest sample moved from ``was`` to ``now`` (None:
    not there, or no longer). Reports mostly come in time order, so a pod usually moves
    to the end; a copy of one bucket's entries (a hundredth of the situation's pods)."""
    times, pods = entries
    if was is not None:
        at = bisect.bisect_left(times, was)
        while pods[at] != pod:  # pods whose newest samples share a time
            at += 1
        times, pods = times[:at] + times[at + 1 :], pods[:at] + pods[at + 1 :]
    if now is None:
        return times, pods
    if not times or times[-1] <= now:
        return (*times, now), (*pods, pod)
    at = bisect.bisect_right(times, now)
    return (*times[:at], now, *times[at:]), (*pods[:at], pod, *pods[at:])


class _Tally:
    """One backend in one situation, as the index's writer changes it.

    Each pod keeps at most ``per_pod`` samples, oldest first; every counted TFLOP/s is
    also in ``values``, kept sorted, so the median is a lookup and a new sample costs a
    binary search and a memmove within one chunk, never a copy of the samples.

    The pods of each stage bucket (``core/stages.py``; a pod's is hashed when its
    newest sample changes, not stored) are kept in ``recent`` ordered by their newest
    sample: a rollout guard reads the samples of its stage's buckets reported since the
    stage began, and never walks (or hashes) the rest of the situation's history.

    **Nothing here costs the garbage collector.** What a tally keeps per pod is tuples
    of floats and strings in plain dicts, which CPython stops tracking once a collection
    has seen them: a replica holding 100,000 pods' samples gives each collection a
    few objects per tally to walk, not one or two per pod (a full collection went from
    100 ms to a few, and it holds every thread, the event loop's too). Replacing a
    pod's tuple copies at most ``per_pod`` samples."""

    __slots__ = (
        "_failures_newest_first",
        "by_pod",
        "failures",
        "impls",
        "recent",
        "values",
    )

    def __init__(self) -> None:
        self.by_pod: dict[PodKey, PodSamples] = {}
        self.values = _SortedFloats()
        self.impls: Counter[str] = Counter()
        self.failures: dict[PodKey, FailureNote] = {}
        self._failures_newest_first: tuple[FailureNote, ...] | None = ()
        self.recent: dict[int | None, Ordered] = {}

    def add_sample(self, pod: PodKey, sample: Sample, per_pod: int) -> bool:
        samples = self.by_pod.get(pod)
        if samples is None:
            samples, newest = (), None
        else:
            newest = samples[-1][0]
            if len(samples) >= per_pod and sample[0] < samples[0][0]:
                return False  # older than all this pod counts: it would make room for nothing
        if newest is None or sample[0] >= newest:
            samples = (*samples, sample)  # the usual case: newer than all the pod has
            if sample[0] != newest:  # its place in its bucket's order
                bucket = stage_bucket(*pod)
                entries = self.recent.get(bucket, _NONE_ORDERED)
                self.recent[bucket] = _moved(entries, pod, newest, sample[0])
        else:
            at = bisect.bisect_right(samples, sample[0], key=_time_of)
            samples = (*samples[:at], sample, *samples[at:])
        self._count(sample)
        if len(samples) > per_pod:
            self._uncount(samples[0])
            samples = samples[1:]
        self.by_pod[pod] = samples
        return True

    def in_buckets(self, buckets: Iterable[int | None], since: float) -> list[PodSample]:
        """The samples at or after ``since`` (a time key) of the pods in ``buckets``."""
        out: list[PodSample] = []
        for bucket in buckets:
            entries = self.recent.get(bucket)
            if entries is None:
                continue
            times, pods = entries
            for pod in pods[bisect.bisect_left(times, since) :]:
                samples = self.by_pod[pod]
                first = bisect.bisect_left(samples, since, key=_time_of)
                out.extend((pod[0], pod[1], s[1]) for s in samples[first:])
        return out

    def add_failure(self, pod: PodKey, note: FailureNote) -> bool:
        known = self.failures.get(pod)
        if known is not None and _failure_key(note.at) < _failure_key(known.at):
            return False  # a pod counts once, with its newest note
        self.failures[pod] = note
        self._failures_newest_first = None
        return True

    def clear_failures(self, cutoff: float) -> bool:
        """Forget failures noted at or before ``cutoff`` (a time key; undated ones too)."""
        gone = [
            pod
            for pod, note in self.failures.items()
            if note.at is None or note.at.timestamp() <= cutoff
        ]
        for pod in gone:
            del self.failures[pod]
        if gone:
            self._failures_newest_first = None
        return bool(gone)

    def _count(self, sample: Sample) -> None:
        self.values.add(sample[1])
        if sample[2]:
            self.impls[sample[2]] += 1

    def _uncount(self, sample: Sample) -> None:
        self.values.remove(sample[1])
        impl = sample[2]
        if impl:
            self.impls[impl] -= 1
            if self.impls[impl] <= 0:
                del self.impls[impl]

    def prune(self, cutoff: float) -> bool:
        """Drop samples and failures older than ``cutoff`` (a time key)."""
        changed = False
        for pod, samples in list(self.by_pod.items()):
            first = bisect.bisect_right(samples, -math.inf, key=_time_of)  # undated stay
            last = bisect.bisect_left(samples, cutoff, key=_time_of)
            if last <= first:
                continue
            newest = samples[-1][0]
            for sample in samples[first:last]:
                self._uncount(sample)
            samples = samples[:first] + samples[last:]
            changed = True
            if not samples or samples[-1][0] != newest:
                bucket = stage_bucket(*pod)
                entries = _moved(
                    self.recent[bucket], pod, newest, samples[-1][0] if samples else None
                )
                if entries[0]:
                    self.recent[bucket] = entries
                else:
                    del self.recent[bucket]
            if samples:
                self.by_pod[pod] = samples
            else:
                del self.by_pod[pod]
        for pod, note in list(self.failures.items()):
            if _failure_key(note.at) < cutoff:
                del self.failures[pod]
                self._failures_newest_first = None
                changed = True
        return changed

    def empty(self) -> bool:
        return not self.by_pod and not self.failures

    def stats(self) -> BackendStats:
        if self._failures_newest_first is None:
            self._failures_newest_first = tuple(
                sorted(self.failures.values(), key=lambda f: _failure_key(f.at), reverse=True)
            )
        return BackendStats(
            median_tflops=self.values.median(),
            samples=len(self.values),
            pods=len(self.by_pod),
            impls=frozenset(self.impls),
            failures=self._failures_newest_first,
        )


def _time_of(sample: Sample) -> float:
    return sample[0]


class EvidenceIndex:
    """Evidence per situation and backend, with a bounded cost (module docstring).

    Writers (:meth:`add`, :meth:`prune`) take an internal lock and, when done, publish
    each changed situation's summaries as a new mapping with one assignment; readers
    (:meth:`group`, :meth:`exclusions`, :meth:`eligible`, :meth:`rank`) take no lock and
    read only those published mappings. ``version`` changes on every write that
    changed something.
    """

    __slots__ = (
        "_earliest",
        "_frozen",
        "_lock",
        "_next_lapse",
        "_published",
        "_tallies",
        "_version",
        "failure_policy",
        "min_pods",
        "min_samples",
        "per_pod",
    )

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
        self.min_samples = min_samples
        self.min_pods = min_pods
        self.failure_policy = failure_policy or FailurePolicy()
        self.per_pod = per_pod
        self._lock = threading.Lock()
        self._tallies: dict[Situation, dict[Backend, _Tally]] = {}
        self._published: dict[Situation, Group] = {}
        self._version = 0
        self._frozen = False
        self._earliest = math.inf  # no sample or failure is older: prune has nothing to do
        self._next_lapse = math.inf  # when a failure next leaves the policy's window
        self.add(observations)

    # ---------------------------------------------------------------- writes

    def add(self, observations: Iterable[Observation]) -> bool:
        """Fold ``observations`` in; True when anything that counts changed.

        Per observation: a dict lookup, a binary search and a memmove in the sorted
        TFLOP/s of its backend; each changed situation is published once at the end."""
        if self._frozen:
            raise TypeError("this evidence index is shared and read-only")
        with self._lock:
            touched: dict[Situation, set[Backend]] = {}
            # a report's results share one situation: find each tally once per call
            found: dict[tuple[Situation, str], tuple[Backend, _Tally] | None] = {}
            for o in observations:
                key = (o.situation, o.backend)
                if key not in found:
                    backend = _backend(o.backend)
                    found[key] = (
                        None if backend is None else (backend, self._tally(*key[:1], backend))
                    )
                target = found[key]
                if target is not None and self._apply(o, target[1]):
                    touched.setdefault(o.situation, set()).add(target[0])
            for situation, backend_name in list(found):  # tallies made for nothing
                target = found[(situation, backend_name)]
                if target is not None and target[1].empty():
                    self._tallies[situation].pop(target[0], None)
                    if not self._tallies[situation]:
                        del self._tallies[situation]
            self._publish(touched)
            return bool(touched)

    def _apply(self, o: Observation, tally: _Tally) -> bool:
        pod = (o.cluster, o.pod)
        if o.ok:
            if o.tflops is None or math.isnan(o.tflops):
                return False
            impl = sys.intern(o.impl) if o.impl else None  # one string per code path
            sample = (_sample_key(o.at), float(o.tflops), impl)
            if not tally.add_sample(pod, sample, self.per_pod):
                return False
            if sample[0] > -math.inf:
                self._earliest = min(self._earliest, sample[0])
            return True
        note = FailureNote(o.cluster, o.pod, o.at, o.error or "wrong result or failed build")
        if not tally.add_failure(pod, note):
            return False
        if o.at is not None:
            at = o.at.timestamp()
            self._earliest = min(self._earliest, at)
            self._next_lapse = min(
                self._next_lapse, at + self.failure_policy.window.total_seconds()
            )
        return True

    def _tally(self, situation: Situation, backend: Backend) -> _Tally:
        group = self._tallies.setdefault(situation, {})
        found = group.get(backend)
        if found is None:
            found = group[backend] = _Tally()
        return found

    def _publish(self, touched: Mapping[Situation, Iterable[Backend]]) -> None:
        """Replace each touched situation's summaries (one assignment each): a reader
        sees all of one write's changes to a situation, or none."""
        for situation, backends in touched.items():
            tallies = self._tallies.get(situation, {})
            group = dict(self._published.get(situation, _NO_GROUP))
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

    def prune(self, now: datetime, max_age: timedelta) -> bool:
        """Drop samples and failures older than ``max_age`` (the evidence window).

        True when anything changed, or when a failure left the failure policy's window
        since the last prune (an exclusion a cached decision holds has lapsed). Costs
        O(1) while nothing is due, so it can run every poll."""
        cutoff = (now - max_age).timestamp()
        now_ts = now.timestamp()
        with self._lock:
            lapsed = now_ts >= self._next_lapse
            if cutoff <= self._earliest and not lapsed:
                return False
            touched: dict[Situation, list[Backend]] = {}
            earliest = next_lapse = math.inf
            window = self.failure_policy.window.total_seconds()
            for situation, tallies in self._tallies.items():
                for backend, tally in tallies.items():
                    if tally.prune(cutoff):
                        touched.setdefault(situation, []).append(backend)
                    for samples in tally.by_pod.values():
                        first = bisect.bisect_right(samples, -math.inf, key=_time_of)
                        if first < len(samples):
                            earliest = min(earliest, samples[first][0])
                    for note in tally.failures.values():
                        if note.at is not None:
                            at = note.at.timestamp()
                            earliest = min(earliest, at)
                            if at + window > now_ts:
                                next_lapse = min(next_lapse, at + window)
            self._earliest, self._next_lapse = earliest, next_lapse
            self._publish(touched)
            if lapsed and not touched:
                self._version += 1
            return lapsed or bool(touched)

    def freeze(self) -> EvidenceIndex:
        """Make :meth:`add` refuse: for an index that callers share (:data:`EMPTY`)."""
        self._frozen = True
        return self

    # ----------------------------------------------------------------- reads

    @property
    def version(self) -> int:
        return self._version

    def group(self, situation: Situation | None) -> Group:
        if situation is None:
            return _NO_GROUP
        return self._published.get(situation, _NO_GROUP)

    def samples(self, situation: Situation | None, backend: Backend | str) -> list[PodSample]:
        """(cluster, pod, TFLOP/s) of every counted sample, a snapshot. It walks the
        whole situation's history: requests read :meth:`stage_samples` instead, this is
        for tools and tests that want everything."""
        found = _backend(backend) if isinstance(backend, str) else backend
        if situation is None or found is None:
            return []
        with self._lock:
            tally = self._tallies.get(situation, {}).get(found)
            if tally is None:
                return []
            return [(c, p, s[1]) for (c, p), samples in tally.by_pod.items() for s in samples]

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
        found = _backend(backend) if isinstance(backend, str) else backend
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
        found = _backend(backend) if isinstance(backend, str) else backend
        if situation is None or found is None:
            return []
        with self._lock:
            tally = self._tallies.get(situation, {}).get(found)
            samples = None if tally is None else tally.by_pod.get((cluster, pod))
            return [] if samples is None else [s[1] for s in samples]

    def counted(self) -> list[Observation]:
        """Everything that counts, as observations (a snapshot): what another index
        needs to hold the same evidence."""
        out: list[Observation] = []
        with self._lock:
            for situation, tallies in self._tallies.items():
                for backend, tally in tallies.items():
                    for (cluster, pod), samples in tally.by_pod.items():
                        out.extend(
                            Observation(situation, backend.value, pod, t, ok=True,
                                        cluster=cluster, at=_time_back(key), impl=impl)
                            for key, t, impl in samples
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

    def exclusions(self, situation: Situation | None, now: datetime) -> dict[Backend, str]:
        """Backends the failure policy excludes in ``situation``, with the reason."""
        out: dict[Backend, str] = {}
        for backend, stats in self.group(situation).items():
            if stats.failures:
                reason = self.failure_policy.exclusion_of_latest(stats.failures, now)
                if reason is not None:
                    out[backend] = reason
        return out

    def eligible(
        self, situation: Situation | None, valid: Iterable[Backend]
    ) -> list[tuple[Backend, BackendStats]]:
        """Valid backends with enough correct samples, fastest first (ties: table
        order). ``valid`` must already leave out what :meth:`exclusions` excludes."""
        group = self.group(situation)
        order = {b: i for i, b in enumerate(Backend)}
        ranked = [
            (b, group[b])
            for b in valid
            if b in group
            and group[b].samples >= self.min_samples
            and group[b].pods >= self.min_pods
        ]
        ranked.sort(key=lambda bs: (-(bs[1].median_tflops or 0.0), order[bs[0]]))
        return ranked

    def rank(self, situation: Situation | None, valid: Iterable[Backend]) -> Evidence | None:
        """The measured winner among ``valid``, or None when the evidence is too thin."""
        ranked = self.eligible(situation, valid)
        if not ranked:
            return None
        (best, stats), runner = ranked[0], ranked[1] if len(ranked) > 1 else None
        best_tflops = stats.median_tflops or 0.0
        runner_tflops = None if runner is None else runner[1].median_tflops
        return Evidence(
            backend=best,
            median_tflops=round(best_tflops, 3),
            samples=stats.samples,
            pods=stats.pods,
            runner_up=None if runner is None else runner[0],
            runner_up_tflops=None if runner_tflops is None else round(runner_tflops, 3),
            margin=None
            if not runner_tflops
            else round((best_tflops - runner_tflops) / runner_tflops, 4),
        )

    def summary(self, now: datetime | None = None) -> list[dict[str, Any]]:
        now = now or datetime.now(UTC)
        with self._lock:
            published = dict(self._published)
        out = []
        for situation in sorted(published):
            excluded = self.exclusions(situation, now)
            for backend, stats in sorted(published[situation].items()):
                median = stats.median_tflops
                out.append(
                    {
                        "device": situation.device,
                        "capability": situation.capability,
                        "dims": [int(x) for x in situation.dims.split(",")],
                        "dtype": situation.dtype,
                        "engine": situation.engine,
                        "backend": backend.value,
                        "impls": sorted(stats.impls),
                        "packages": json.loads(situation.packages),
                        "samples": stats.samples,
                        "pods": stats.pods,
                        "failures": len(stats.failures),
                        "excluded": excluded.get(backend),
                        "median_tflops": None if median is None else round(median, 3),
                    }
                )
        return out


def _backend(name: str) -> Backend | None:
    try:
        return Backend(name)
    except ValueError:
        return None


def _time_back(key: float) -> datetime | None:
    return None if key == -math.inf else datetime.fromtimestamp(key, UTC)


def observations_of_report(
    report: MeasurementReport, at: datetime | None = None, report_id: str | None = None
) -> list[Observation]:
    """The observations a measurement report contributes (none without a GPU); each
    names its source (``report_id`` and the result's index): the store's read names the
    same report (:func:`report_key`), so a replica counts it once."""
    cap = report.device.capability
    if cap is None:
        return []
    situation = _situation(report, cap, report.packages)
    return [
        Observation(
            situation=situation,
            backend=r.backend.value,
            pod=report.pod,
            tflops=r.tflops,
            ok=r.correct and r.error is None,
            cluster=report.cluster,
            at=at,
            error=r.error if r.error is not None else (None if r.correct else "wrong result"),
            impl=r.impl,
            source="" if report_id is None else measurement_source(report_id, i),
        )
        for i, r in enumerate(report.results)
    ]


def measurement_source(report_id: str, index: int) -> str:
    """One result's source: its report, and its place in it (or its stored row's id)."""
    return f"m:{report_id}:{index}"


def report_key(source: str) -> str:
    """What tells one stored report from another: a measurement's report (all its
    results are stored and applied together), or a failure's own source."""
    if source.startswith("m:"):
        return source.rsplit(":", 1)[0]
    return source


def failure_source(decision_id: str, backend: str, error: str) -> str:
    digest = hashlib.blake2b(error.encode(), digest_size=6).hexdigest()
    return f"f:{decision_id}:{backend}:{digest}"


def failure_observation(
    request: SelectRequest,
    backend: str,
    error: str,
    at: datetime | None,
    pod: str | None,
    decision_id: str = "",
) -> Observation | None:
    """A failure a pod reported for its decision, keyed by that pod's situation."""
    situation = situation_of(request)
    if situation is None:
        return None
    return Observation(
        situation,
        backend,
        pod or "",
        None,
        ok=False,
        cluster=request.cluster,
        at=at,
        error=error,
        source=failure_source(decision_id, backend, error) if decision_id else "",
    )


EMPTY = EvidenceIndex().freeze()
"""No evidence: what the agent's local fallback and a preview without a store use."""
