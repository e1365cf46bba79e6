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

**Every cost follows what counts, once.** An :class:`EvidenceIndex` changes in place
under its own lock and publishes immutable per-situation summaries
(:class:`BackendStats`) with one assignment, which readers (every decision) use
without a lock. Behind them, per situation and backend (``_Tally``):

- each pod's counted samples are one immutable ``bytes`` *record* (18 bytes a sample:
  time, TFLOP/s, code path), kept in a dict per stage bucket that is ordered by the
  pod's newest sample. A report replaces its pod's record and, when its newest sample
  moved, deletes and re-inserts the pod (O(1)); nothing is ever copied per pod (the
  ordered tuples of each bucket were copied per pod: building 100,000 pods' evidence
  grew as n^1.9). A late report marks its bucket for sorting on the next read of it;
- every counted TFLOP/s is also in chunked sorted arrays whose lengths a Fenwick tree
  sums, so an insertion is a memmove within a chunk and the median a descent;
- a heap of (time, pod) entries, bytes that sort as the time, one per pod at or
  before its oldest dated sample, is what :meth:`EvidenceIndex.prune` pops up to the
  evidence window's cutoff: a prune looks at what expired (and at pods that moved on
  since their entry was filed, once each), never at every pod, and runs in steps
  that let the event loop in;
- none of it is a container per pod: a collection has a few objects per tally to
  visit, whatever the pods.

**A full read is a bulk load** (:class:`EvidenceLoader`): rows come as plain tuples,
each pod's record is bounded as it is read (the loader holds what counts, never the
history), then every pod is filed once into each index that trusts its cluster, the
record and the heap entry shared between them, and each index's TFLOP/s are sorted in
pieces instead of inserted one by one; an index that takes exactly the same pods as
another (a situation seen in one cluster) copies it. History beyond the window is
never read into memory at all: a reader starts at the window's first row, and nothing
reads older rows (the store keeps them).

:meth:`EvidenceIndex.with_observations` still gives a new index, by copying (for tests
and one-off comparisons).
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import json
import math
import struct
import sys
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from mla_switchboard.core.engines import OWN_ENGINE
from mla_switchboard.core.schemas import EngineInfo, Evidence, MeasurementReport, SelectRequest
from mla_switchboard.core.specs import KERNEL_PACKAGES as _PACKAGES
from mla_switchboard.core.specs import Backend, format_capability
from mla_switchboard.core.stages import pod_key, stage_bucket_of_key

__all__ = [
    "KERNEL_PACKAGES",
    "SAMPLES_PER_POD",
    "BackendStats",
    "EvidenceIndex",
    "EvidenceLoader",
    "FailureNote",
    "FailurePolicy",
    "LoadedSample",
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

    def __post_init__(self) -> None:
        # a situation is a key of every lookup a decision or a report makes: hash its
        # six strings once, not at each lookup
        object.__setattr__(self, "_hash", hash(_fields_of(self)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined,no-any-return]

    def __reduce__(self) -> tuple[type[Situation], tuple[str, ...]]:
        return (Situation, _fields_of(self))  # the hash of a string differs per process


def _fields_of(situation: Situation) -> tuple[str, ...]:
    """A situation's fields, in order (``dataclasses.astuple`` copies deeply: slower)."""
    s = situation
    return (s.device, s.capability, s.dims, s.dtype, s.packages, s.engine)


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

    def exclusion_of_latest(
        self,
        latest: Sequence[FailureNote],
        now: datetime,
        shown: Callable[[str], bool] | None = None,
    ) -> str | None:
        """As :meth:`exclusion`, for one note per pod, newest first (what
        :attr:`BackendStats.failures` holds): a binary search finds the pods within the
        window, so a decision never walks every failing pod. ``shown``: the clusters
        whose pods the reader may see quoted; the others' pods are only counted (a
        reader limited to some clusters learns that a backend is excluded and by how
        many pods elsewhere, never their names or errors)."""
        since = -(now - self.window).timestamp()
        recent = bisect.bisect_right(latest, since, key=lambda f: -_failure_key(f.at))
        if recent == 0 or recent < self.min_pods:
            return None
        hidden = 0
        quoted: Sequence[FailureNote]
        if shown is None:  # a decision's reason: never walks every failing pod
            quoted, quotable = latest[: min(recent, 3)], recent
        else:
            mine = [n for n in latest[:recent] if shown(n.cluster)]
            quoted, quotable, hidden = mine[:3], len(mine), recent - len(mine)
        parts = [n.describe() for n in quoted]
        if quotable > 3:
            parts.append(f"and {quotable - 3} more")
        if hidden:
            parts.append(f"{_pods(hidden)} in clusters outside your scope")
        hours = self.window.total_seconds() / 3600
        return f"failed on {_pods(recent)} in the last {hours:g} h (measured policy): " + (
            "; ".join(parts)
        )


def _pods(n: int) -> str:
    return "1 pod" if n == 1 else f"{n} pods"


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
PodSample = tuple[str, str, float]
"""(cluster, pod, TFLOP/s) of one counted sample"""


_NO_GROUP: Group = MappingProxyType({})


class _SortedFloats:
    """A sorted multiset of floats, in chunks of ``CHUNK`` to ``2 * CHUNK`` items.

    An insertion or removal is a binary search and a memmove within one chunk, so its
    cost does not grow with the number of samples (one flat sorted list moved half of
    them each time). The chunks' lengths are summed in a Fenwick tree, so the median
    (which every write publishes) is a descent of it, not a walk of every chunk; a
    write only notes which chunk grew or shrank, and a split or merge of chunks has it
    rebuilt by the next read (once every few hundred writes). A chunk is an
    ``array('d')``: 8 bytes a value instead of a float object and its pointer, and
    nothing inside it for the garbage collector to visit. A bulk load sorts instead
    (:meth:`of`)."""

    CHUNK = 256
    PIECE = 8192
    """Values :meth:`of` sorts in one call (a millisecond or two)."""
    __slots__ = ("_chunks", "_len", "_maxes", "_pending", "_tree")

    def __init__(self) -> None:
        self._chunks: list[array[float]] = []
        self._maxes: list[float] = []  # each chunk's largest item, for the binary search
        self._len = 0
        self._tree: list[int] | None = None  # Fenwick tree of the chunks' lengths
        self._pending: dict[int, int] = {}  # chunk -> change in length since it was read

    @classmethod
    def of(cls, values: Sequence[float], pause: Callable[[], None] = lambda: None) -> _SortedFloats:
        """``values`` (in any order), sorted in steps of at most ``PIECE`` values with
        ``pause`` between them: a bulk load never holds the interpreter for one sort of
        everything (200,000 values take 80 ms on one slow core).

        Every ``CHUNK``-th value is a splitter; each piece is sorted and cut at the
        splitters into bins, which hold about ``CHUNK`` values each, in order; a bin
        (runs already sorted) is then merged and becomes a chunk or a few."""
        out = cls()
        if not values:
            return out
        splitters = sorted(values[:: cls.CHUNK])[1:]
        bins: list[list[float]] = [[] for _ in range(len(splitters) + 1)]
        for start in range(0, len(values), cls.PIECE):
            piece = sorted(values[start : start + cls.PIECE])
            lo = 0
            for b, splitter in enumerate(splitters):
                hi = bisect.bisect_left(piece, splitter, lo)
                if hi > lo:
                    bins[b] += piece[lo:hi]
                    lo = hi
            bins[-1] += piece[lo:]
            pause()
        done = 0
        for found in bins:
            if not found:
                continue
            found.sort()
            step = len(found) if len(found) <= 2 * cls.CHUNK else cls.CHUNK
            for at in range(0, len(found), step):
                chunk = array("d", found[at : at + step])
                out._chunks.append(chunk)
                out._maxes.append(chunk[-1])
            done += len(found)
            if done >= cls.PIECE:
                done = 0
                pause()
        out._len = len(values)
        return out

    def copy(self) -> _SortedFloats:
        out = type(self)()
        out._chunks = [chunk[:] for chunk in self._chunks]
        out._maxes = list(self._maxes)
        out._len = self._len
        return out

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
            self._tree = None
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
            self._tree = None
        elif self._tree is not None:
            self._pending[i] = self._pending.get(i, 0) + 1

    def remove(self, value: float) -> None:
        """Remove one item equal to ``value`` (which must be there)."""
        i = bisect.bisect_left(self._maxes, value)
        chunk = self._chunks[i]
        del chunk[bisect.bisect_left(chunk, value)]
        self._len -= 1
        if not chunk:
            del self._chunks[i]
            del self._maxes[i]
            self._tree = None
            return
        self._maxes[i] = chunk[-1]
        if len(chunk) < self.CHUNK // 2 and len(self._chunks) > 1:
            self._merge(min(i, len(self._chunks) - 2))
            self._tree = None
        elif self._tree is not None:
            self._pending[i] = self._pending.get(i, 0) - 1

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

    def _lengths(self) -> list[int]:
        """The Fenwick tree of the chunks' lengths, brought up to date."""
        tree = self._tree
        n = len(self._chunks)
        if tree is None:
            tree = [0] * (n + 1)
            for i in range(1, n + 1):
                tree[i] += len(self._chunks[i - 1])
                parent = i + (i & -i)
                if parent <= n:
                    tree[parent] += tree[i]
            self._tree = tree
        else:
            for chunk, change in self._pending.items():
                i = chunk + 1
                while i <= n:
                    tree[i] += change
                    i += i & -i
        self._pending.clear()
        return tree

    def __getitem__(self, k: int) -> float:
        if not 0 <= k < self._len:
            raise IndexError(k)
        tree = self._lengths()
        n, chunk, step = len(tree) - 1, 0, 1 << (len(tree) - 1).bit_length()
        while step:  # the last chunk whose predecessors hold at most k items
            if chunk + step <= n and tree[chunk + step] <= k:
                chunk += step
                k -= tree[chunk]
            step >>= 1
        return self._chunks[chunk][k]

    def median(self) -> float | None:
        n = self._len
        if n == 0:
            return None
        mid = n // 2
        return self[mid] if n % 2 else (self[mid - 1] + self[mid]) / 2


# ------------------------------------------------------------ one pod's samples

_RECORD = struct.Struct("<ddH")
"""One counted sample as a pod's record holds it: time key, TFLOP/s, impl id."""
_SIZE = _RECORD.size
_TIME = struct.Struct("<d")

Record = bytes
"""One pod's counted samples in one situation and backend, oldest first (at most
``per_pod``): ``_RECORD`` after ``_RECORD``. Immutable, so indexes built together
share one pod's record, and not a container: the collector never visits it."""


def _time_at(record: Record, offset: int) -> float:
    return _TIME.unpack_from(record, offset)[0]  # type: ignore[no-any-return]


def _newest(record: Record) -> float:
    return _TIME.unpack_from(record, len(record) - _SIZE)[0]  # type: ignore[no-any-return]


def _oldest_dated(record: Record) -> float:
    """The time key of the oldest sample with a time (undated ones come first), inf
    when there is none: when the record next has something to expire."""
    for offset in range(0, len(record), _SIZE):
        at = _time_at(record, offset)
        if at != -math.inf:
            return at
    return math.inf


def _with_sample(
    record: Record, sample: bytes, at: float, per_pod: int
) -> tuple[Record, bytes | None] | None:
    """``record`` with ``sample`` (time key ``at``) in its place in time, after the
    samples of the same time, and the oldest sample if it had to make room; None when
    the record is full and ``sample`` is older than all of it (it would make room for
    nothing)."""
    n = len(record) // _SIZE
    if n >= per_pod and at < _time_at(record, 0):
        return None
    if at >= _time_at(record, len(record) - _SIZE):
        new = record + sample  # the usual case: newer than all the pod has
    else:
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if at < _time_at(record, mid * _SIZE):
                hi = mid
            else:
                lo = mid + 1
        new = record[: lo * _SIZE] + sample + record[lo * _SIZE :]
    if n >= per_pod:
        return new[_SIZE:], new[:_SIZE]
    return new, None


def _split_expired(record: Record, cutoff: float) -> tuple[Record, Record]:
    """(what stays, what expired): the dated samples older than ``cutoff`` expire."""
    start = 0
    while start < len(record) and _time_at(record, start) == -math.inf:
        start += _SIZE
    end = start
    while end < len(record) and _time_at(record, end) < cutoff:
        end += _SIZE
    if end == start:
        return record, b""
    return record[:start] + record[end:], record[start:end]


_IMPL_NAMES: list[str | None] = [None]
_IMPL_IDS: dict[str, int] = {}
_IMPL_LOCK = threading.Lock()
MAX_IMPL_NAMES = 0xFFFF
"""Distinct code-path names a process tells apart (``impl``: "flashinfer-fa3"); a
record holds a name's number. Names beyond that many count their samples, unnamed:
only a fleet reporting tens of thousands of made-up names would see it."""


def _impl_id(name: str | None) -> int:
    if not name:
        return 0
    found = _IMPL_IDS.get(name)
    if found is not None:
        return found
    with _IMPL_LOCK:
        found = _IMPL_IDS.get(name)
        if found is None:
            if len(_IMPL_NAMES) >= MAX_IMPL_NAMES:
                return 0
            found = len(_IMPL_NAMES)
            _IMPL_NAMES.append(sys.intern(name))
            _IMPL_IDS[_IMPL_NAMES[found]] = found  # type: ignore[index]
        return found


class _Fields(dict[int, struct.Struct]):
    """One field of every sample of a record of n samples, in one unpack: ``_VALUES[n]``
    the TFLOP/s, ``_IMPLS[n]`` the impl ids (a bulk load reads 400,000 records)."""

    def __init__(self, skip: int, code: str, rest: int) -> None:
        super().__init__()
        self._one = f"{skip}x{code}{rest}x" if rest else f"{skip}x{code}"

    def __missing__(self, n: int) -> struct.Struct:
        found = self[n] = struct.Struct("<" + self._one * n)
        return found


_VALUES = _Fields(8, "d", 2)
_IMPLS = _Fields(16, "H", 0)


_ORDER = struct.Struct(">Q")
_TIME_BE = struct.Struct(">d")
_SIGN = 1 << 63


def _expiry(at: float, key: str) -> bytes:
    """A heap entry: ``at`` as 8 bytes that sort as the time does, then the pod's key.
    Bytes, not a (time, key) tuple: nothing for the collector to track per pod (a
    bulk load of 400,000 pods made tens of young collections of several ms each), and
    shared by the indexes a bulk load fills."""
    (bits,) = _ORDER.unpack(_TIME_BE.pack(at))
    bits = bits ^ 0xFFFF_FFFF_FFFF_FFFF if bits & _SIGN else bits | _SIGN
    return _ORDER.pack(bits) + key.encode()


def _expiry_time(entry: bytes) -> float:
    (bits,) = _ORDER.unpack_from(entry)
    bits = bits ^ _SIGN if bits & _SIGN else bits ^ 0xFFFF_FFFF_FFFF_FFFF
    return _TIME_BE.unpack(_ORDER.pack(bits))[0]  # type: ignore[no-any-return]


def _expiry_key(entry: bytes) -> str:
    return sys.intern(entry[8:].decode())


def _split_key(key: str) -> tuple[str, str]:
    cluster, _, pod = key.partition("\0")
    return cluster, pod


class _Tally:
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
    situation's pods).

    **Expiry** is a heap of (time key, pod) entries (``_expiry``: bytes that sort as
    the time): each pod with a dated sample has an entry no later than its oldest
    dated sample (a newer one is added when an older sample arrives; one whose pod
    moved on is corrected when it comes up). A prune pops only the entries older than
    its cutoff: what expired, not every pod.

    Every counted TFLOP/s is also in ``values``, kept sorted, so the median is a
    lookup and a new sample costs a binary search and a memmove within one chunk.

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
        "values",
    )

    def __init__(self) -> None:
        self.buckets: dict[int | None, dict[str, Record]] = {}
        self.disordered: set[int | None] = set()
        self.expiry: list[bytes] = []  # a heap of _expiry(time, pod) entries
        self.pods = 0
        self.values = _SortedFloats()
        self.impls: Counter[int] = Counter()
        self.failures: dict[str, FailureNote] = {}
        self._failures_newest_first: tuple[FailureNote, ...] | None = ()

    # ------------------------------------------------------------- samples

    def record(self, key: str, bucket: int | None) -> Record | None:
        pods = self.buckets.get(bucket)
        return None if pods is None else pods.get(key)

    def records(self) -> Iterator[tuple[str, Record]]:
        for pods in self.buckets.values():
            yield from pods.items()

    def add_sample(
        self, key: str, bucket: int | None, at: float, value: float, impl: int, per_pod: int
    ) -> bool:
        sample = _RECORD.pack(at, value, impl)
        pods = self.buckets.get(bucket)
        if pods is None:
            pods = self.buckets[bucket] = {}
        record = pods.get(key)
        if record is None:
            self._place(pods, bucket, key, sample, at)
            self.pods += 1
            self._count(value, impl)
            if at != -math.inf:
                heapq.heappush(self.expiry, _expiry(at, key))
            return True
        changed = _with_sample(record, sample, at, per_pod)
        if changed is None:
            return False
        new, made_room = changed
        self._count(value, impl)
        if made_room is not None:
            _, old_value, old_impl = _RECORD.unpack(made_room)
            self._uncount(old_value, old_impl)
        if at > _newest(record):  # its place in its bucket's order
            del pods[key]
            self._place(pods, bucket, key, new, at)
        else:
            pods[key] = new
        if at != -math.inf and at < _oldest_dated(record):
            heapq.heappush(self.expiry, _expiry(at, key))  # expires before the pod's entry
        return True

    def _place(
        self, pods: dict[str, Record], bucket: int | None, key: str, record: Record, newest: float
    ) -> None:
        """Put ``record`` last in its bucket (noting when that breaks the order)."""
        if pods and bucket not in self.disordered and newest < _newest(pods[next(reversed(pods))]):
            self.disordered.add(bucket)
        pods[key] = record

    def _ordered(
        self, bucket: int | None, newest: Callable[[str], float] | None = None
    ) -> dict[str, Record] | None:
        """A bucket's pods, sorted first if a late report disordered them (``newest``:
        each pod's newest time by its key, when the caller knows them already)."""
        pods = self.buckets.get(bucket)
        if pods is not None and bucket in self.disordered:
            by_time = sorted(pods, key=newest or (lambda key: _newest(pods[key])))
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
        for bucket in buckets:
            pods = self._ordered(bucket)
            if not pods:
                continue
            recent: list[tuple[str, Record]] = []
            for key, record in reversed(pods.items()):
                if _newest(record) < since:
                    break
                recent.append((key, record))
            for key, record in reversed(recent):
                cluster, pod = _split_key(key)
                out.extend(
                    (cluster, pod, value)
                    for at, value, _ in _RECORD.iter_unpack(record)
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
        if known is not None and _failure_key(note.at) < _failure_key(known.at):
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
                sorted(self.failures.values(), key=lambda f: _failure_key(f.at), reverse=True)
            )
        return self._failures_newest_first

    # --------------------------------------------------------------- expiry

    def earliest(self) -> float:
        """The oldest dated sample or failure (inf: nothing can expire)."""
        earliest = _expiry_time(self.expiry[0]) if self.expiry else math.inf
        notes = self.failures_newest_first()
        if notes and notes[-1].at is not None:
            earliest = min(earliest, notes[-1].at.timestamp())
        return earliest

    def next_lapse(self, now: float, window: float) -> float:
        """When a failure next leaves the failure policy's window (inf: none will)."""
        notes = self.failures_newest_first()
        # the notes newer than now - window are a prefix: its last one lapses first
        newer = bisect.bisect_left(notes, window - now, key=lambda f: -_failure_key(f.at))
        if newer == 0:
            return math.inf
        return _failure_key(notes[newer - 1].at) + window

    def prune(self, cutoff: float, budget: int, handled: dict[str, float]) -> tuple[bool, int]:
        """Drop at most about ``budget`` entries' worth of what is older than ``cutoff``:
        (anything changed, entries looked at). ``handled`` (pod -> the entry it was
        given) lasts one prune, so a pod's extra entries are dropped, not repeated."""
        changed, used = False, 0
        expiry, due = self.expiry, _expiry(cutoff, "")  # entries before it are due
        while expiry and expiry[0] < due and used < budget:
            key = _expiry_key(heapq.heappop(expiry))
            used += 1
            bucket = stage_bucket_of_key(key)
            pods = self.buckets.get(bucket)
            record = None if pods is None else pods.get(key)
            if pods is None or record is None:
                continue  # the pod is gone already
            kept, expired = _split_expired(record, cutoff)
            if expired:
                changed = True
                for _, value, impl in _RECORD.iter_unpack(expired):
                    self._uncount(value, impl)
                if not kept:
                    del pods[key]
                    self.pods -= 1
                    if not pods:
                        del self.buckets[bucket]
                        self.disordered.discard(bucket)
                    continue
                if _newest(kept) != _newest(record):  # only undated samples are left
                    del pods[key]
                    self._place(pods, bucket, key, kept, _newest(kept))
                else:
                    pods[key] = kept
            oldest = _oldest_dated(kept)
            if oldest != math.inf and handled.get(key) != oldest:
                handled[key] = oldest
                heapq.heappush(expiry, _expiry(oldest, key))
        if self.failures and used < budget:
            notes = self.failures_newest_first()
            keep = len(notes)
            while keep and _failure_key(notes[keep - 1].at) < cutoff and used < budget:
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
            median_tflops=self.values.median(),
            samples=len(self.values),
            pods=self.pods,
            impls=frozenset(_IMPL_NAMES[i] for i in self.impls),  # type: ignore[misc]
            failures=self.failures_newest_first(),
        )


PRUNE_STEP = 1000
"""Heap entries a prune pops between two pauses (a few ms, during which a report
waits for the index's lock)."""
LOAD_STEP = 2000
"""Pods a bulk load files between two pauses."""


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
        "pruned",
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
            # a report's results share one situation and pod: find each once per call
            found: dict[tuple[Situation, str], tuple[Backend, _Tally] | None] = {}
            buckets: dict[str, int | None] = {}
            for o in observations:
                key = (o.situation, o.backend)
                target = found.get(key, _MISSING)
                if target is _MISSING:
                    backend = _backend(o.backend)
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
            self._publish(touched)
            return bool(touched)

    def _apply(self, o: Observation, tally: _Tally, key: str, bucket: int | None) -> bool:
        if o.ok:
            if o.tflops is None or math.isnan(o.tflops):
                return False
            at, impl = _sample_key(o.at), _impl_id(o.impl)
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
                tally.values = _SortedFloats()
        pause()

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
            out: list[PodSample] = []
            for key, record in tally.records():
                cluster, pod = _split_key(key)
                out.extend((cluster, pod, value) for _, value, _ in _RECORD.iter_unpack(record))
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
        key = pod_key(cluster, pod)
        with self._lock:
            tally = self._tallies.get(situation, {}).get(found)
            record = None if tally is None else tally.record(key, stage_bucket_of_key(key))
            return [] if record is None else [v for _, v, _ in _RECORD.iter_unpack(record)]

    def counted(self) -> list[Observation]:
        """Everything that counts, as observations (a snapshot): what another index
        needs to hold the same evidence."""
        out: list[Observation] = []
        with self._lock:
            for situation, tallies in self._tallies.items():
                for backend, tally in tallies.items():
                    for key, record in tally.records():
                        cluster, pod = _split_key(key)
                        out.extend(
                            Observation(situation, backend.value, pod, t, ok=True,
                                        cluster=cluster, at=_time_back(at),
                                        impl=_IMPL_NAMES[impl])
                            for at, t, impl in _RECORD.iter_unpack(record)
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

    def exclusions(
        self,
        situation: Situation | None,
        now: datetime,
        shown: Callable[[str], bool] | None = None,
    ) -> dict[Backend, str]:
        """Backends the failure policy excludes in ``situation``, with the reason
        (quoting the pods of the clusters ``shown`` accepts; None: every cluster)."""
        out: dict[Backend, str] = {}
        for backend, stats in self.group(situation).items():
            if stats.failures:
                reason = self.failure_policy.exclusion_of_latest(stats.failures, now, shown)
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

    def summary(
        self, now: datetime | None = None, shown: Callable[[str], bool] | None = None
    ) -> list[dict[str, Any]]:
        """Every situation and backend's figures; exclusion reasons quote the pods of
        the clusters ``shown`` accepts (None: every cluster) and count the others."""
        now = now or datetime.now(UTC)
        with self._lock:
            published = dict(self._published)
        out = []
        for situation in sorted(published):
            excluded = self.exclusions(situation, now, shown)
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
        tally.values = _SortedFloats.of(self.values, pause)
        step = _SortedFloats.PIECE
        for start in range(0, len(self.impls), step):
            tally.impls.update(self.impls[start : start + step])
            pause()
        tally.impls.pop(0, None)
        tally.order(pause, newest)
        if tally.expiry:
            self.index._earliest = min(self.index._earliest, _expiry_time(tally.expiry[0]))
        self.values, self.impls, self.last = array("d"), array("H"), {}

    def copy(self, source: _Filling, pause: Callable[[], None]) -> None:
        """The same pods as ``source`` (finished): its records and heap entries shared,
        its dicts and sorted chunks copied in C, a bucket a step."""
        tally, done = self.tally, source.tally
        for bucket, pods in done.buckets.items():
            tally.buckets[bucket] = dict(pods)
        pause()
        tally.disordered = set(done.disordered)
        tally.expiry = list(done.expiry)
        tally.pods = done.pods
        tally.values = done.values.copy()
        tally.impls = Counter(done.impls)
        if tally.expiry:
            self.index._earliest = min(self.index._earliest, _expiry_time(tally.expiry[0]))
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
            known = _backend(backend)
            found = None if known is None else self._records.setdefault((situation, known), {})
            self._known[(situation, backend)] = found
        return found  # type: ignore[no-any-return]

    def add_samples(self, samples: Iterable[LoadedSample]) -> None:
        """Counted results (see :data:`LoadedSample`), in any order."""
        per_pod, pack, time_at = self.per_pod, _RECORD.pack, _TIME.unpack_from
        full = per_pod * _SIZE
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
                impl_id = impls[impl] = _impl_id(impl)
            key = f"{cluster}\0{pod}"
            sample = pack(at, tflops, impl_id)
            record = records.get(key)
            if record is None:
                records[key] = sample
            elif at >= time_at(record, len(record) - _SIZE)[0]:  # newer than all: the usual
                record += sample
                records[key] = record[_SIZE:] if len(record) > full else record
            else:
                changed = _with_sample(record, sample, at, per_pod)
                if changed is not None:
                    records[key] = changed[0]

    def add(self, observations: Iterable[Observation]) -> None:
        """Observations: results as :meth:`add_samples`, a pod's newest failure kept."""
        for o in observations:
            if o.ok:
                if o.tflops is not None:
                    sample = (o.situation, o.backend, o.cluster, o.pod, _sample_key(o.at),
                              float(o.tflops), o.impl, "")  # fmt: skip
                    self.add_samples((sample,))
                continue
            if self._records_of(o.situation, o.backend) is None:
                continue
            slot = (o.situation, o.backend, pod_key(o.cluster, o.pod))
            known = self._failures.get(slot)
            if known is None or _failure_key(o.at) >= _failure_key(known.at):
                self._failures[slot] = o

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
                            for sample in _RECORD.iter_unpack(record):
                                changed = _with_sample(
                                    known, _RECORD.pack(*sample), sample[0], self.per_pod
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
        indexes are the caller's alone until it publishes them)."""
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
        buckets: dict[str, int | None] = {}
        filed = 0
        for (situation, backend), records in self._records.items():
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
                bucket = buckets.get(key, _MISSING)  # once for all a pod's backends
                if bucket is _MISSING:
                    key = keys[key] = sys.intern(key)
                    bucket = buckets[key] = stage_bucket_of_key(key)
                else:
                    key = keys[key]
                n = len(record) // _SIZE
                values, impls = _VALUES[n].unpack(record), _IMPLS[n].unpack(record)
                newest = newest_of[key] = _TIME.unpack_from(record, len(record) - _SIZE)[0]
                oldest = _TIME.unpack_from(record)[0]
                if oldest == -math.inf:  # undated samples come first
                    oldest = _oldest_dated(record)
                entry = _expiry(oldest, key) if oldest != math.inf else b""  # shared too
                for fill in fills:
                    tally = fill.tally
                    pods = tally.buckets.get(bucket)
                    if pods is None:
                        pods = tally.buckets[bucket] = {}
                    if newest >= fill.last.get(bucket, -math.inf):
                        fill.last[bucket] = newest
                    else:
                        tally.disordered.add(bucket)
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
