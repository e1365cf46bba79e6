"""One pod's counted samples as bytes, and the other byte encodings the tallies keep.

A pod's *record* is its counted samples in one situation and backend (18 bytes each:
time key, TFLOP/s, code path id), an expiry heap entry is 8 bytes that sort as a time
and the pod's key: immutable bytes, never a container per pod, so indexes built
together share them and the garbage collector never visits them. Time keys are floats:
a sample without a time is the oldest (``-inf``), a failure without one the newest."""

from __future__ import annotations

import math
import struct
import sys
import threading
from datetime import UTC, datetime

SAMPLES_PER_POD = 8
"""How many of a pod's most recent results count per situation and backend."""


def sample_key(at: datetime | None) -> float:
    """A sample's place in its pod's history: one without a time is the oldest (the
    first to make room) and never expires."""
    return -math.inf if at is None else at.timestamp()


def failure_key(at: datetime | None) -> float:
    """A failure note's age: one without a time is the newest and never expires, as
    the failure policy has always read it."""
    return math.inf if at is None else at.timestamp()


def time_back(key: float) -> datetime | None:
    """The time a sample key stands for (None: the sample had none)."""
    return None if key == -math.inf else datetime.fromtimestamp(key, UTC)


RECORD = struct.Struct("<ddH")
"""One counted sample as a pod's record holds it: time key, TFLOP/s, impl id."""
SAMPLE_SIZE = RECORD.size
TIME = struct.Struct("<d")

Record = bytes
"""One pod's counted samples in one situation and backend, oldest first (at most
``per_pod``): ``RECORD`` after ``RECORD``. Immutable, so indexes built together
share one pod's record, and not a container: the collector never visits it."""


def time_at(record: Record, offset: int) -> float:
    return TIME.unpack_from(record, offset)[0]  # type: ignore[no-any-return]


def record_newest(record: Record) -> float:
    return TIME.unpack_from(record, len(record) - SAMPLE_SIZE)[0]  # type: ignore[no-any-return]


def record_oldest_dated(record: Record) -> float:
    """The time key of the oldest sample with a time (undated ones come first), inf
    when there is none: when the record next has something to expire."""
    for offset in range(0, len(record), SAMPLE_SIZE):
        at = time_at(record, offset)
        if at != -math.inf:
            return at
    return math.inf


def with_sample(
    record: Record, sample: bytes, at: float, per_pod: int
) -> tuple[Record, bytes | None] | None:
    """``record`` with ``sample`` (time key ``at``) in its place in time, after the
    samples of the same time, and the oldest sample if it had to make room; None when
    the record is full and ``sample`` is older than all of it (it would make room for
    nothing)."""
    n = len(record) // SAMPLE_SIZE
    if n >= per_pod and at < time_at(record, 0):
        return None
    if at >= time_at(record, len(record) - SAMPLE_SIZE):
        new = record + sample  # the usual case: newer than all the pod has
    else:
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if at < time_at(record, mid * SAMPLE_SIZE):
                hi = mid
            else:
                lo = mid + 1
        new = record[: lo * SAMPLE_SIZE] + sample + record[lo * SAMPLE_SIZE :]
    if n >= per_pod:
        return new[SAMPLE_SIZE:], new[:SAMPLE_SIZE]
    return new, None


def split_expired(record: Record, cutoff: float) -> tuple[Record, Record]:
    """(what stays, what expired): the dated samples older than ``cutoff`` expire."""
    start = 0
    while start < len(record) and time_at(record, start) == -math.inf:
        start += SAMPLE_SIZE
    end = start
    while end < len(record) and time_at(record, end) < cutoff:
        end += SAMPLE_SIZE
    if end == start:
        return record, b""
    return record[:start] + record[end:], record[start:end]


IMPL_NAMES: list[str | None] = [None]
_IMPL_IDS: dict[str, int] = {}
_IMPL_LOCK = threading.Lock()
MAX_IMPL_NAMES = 0xFFFF
"""Distinct code-path names a process tells apart (``impl``: "flashinfer-fa3"); a
record holds a name's number. Names beyond that many count their samples, unnamed:
only a fleet reporting tens of thousands of made-up names would see it."""


def impl_id_of(name: str | None) -> int:
    if not name:
        return 0
    found = _IMPL_IDS.get(name)
    if found is not None:
        return found
    with _IMPL_LOCK:
        found = _IMPL_IDS.get(name)
        if found is None:
            if len(IMPL_NAMES) >= MAX_IMPL_NAMES:
                return 0
            found = len(IMPL_NAMES)
            IMPL_NAMES.append(sys.intern(name))
            _IMPL_IDS[IMPL_NAMES[found]] = found  # type: ignore[index]
        return found


class _Fields(dict[int, struct.Struct]):
    """One field of every sample of a record of n samples, in one unpack: ``VALUES_OF[n]``
    the TFLOP/s, ``IMPLS_OF[n]`` the impl ids (a bulk load reads 400,000 records)."""

    def __init__(self, skip: int, code: str, rest: int) -> None:
        super().__init__()
        self._one = f"{skip}x{code}{rest}x" if rest else f"{skip}x{code}"

    def __missing__(self, n: int) -> struct.Struct:
        found = self[n] = struct.Struct("<" + self._one * n)
        return found


VALUES_OF = _Fields(8, "d", 2)
IMPLS_OF = _Fields(16, "H", 0)


_ORDER = struct.Struct(">Q")
_TIME_BE = struct.Struct(">d")
_SIGN = 1 << 63


def expiry_entry(at: float, key: str) -> bytes:
    """A heap entry: ``at`` as 8 bytes that sort as the time does, then the pod's key.
    Bytes, not a (time, key) tuple: nothing for the collector to track per pod (a
    bulk load of 400,000 pods made tens of young collections of several ms each), and
    shared by the indexes a bulk load fills."""
    (bits,) = _ORDER.unpack(_TIME_BE.pack(at))
    bits = bits ^ 0xFFFF_FFFF_FFFF_FFFF if bits & _SIGN else bits | _SIGN
    return _ORDER.pack(bits) + key.encode()


def expiry_time(entry: bytes) -> float:
    (bits,) = _ORDER.unpack_from(entry)
    bits = bits ^ _SIGN if bits & _SIGN else bits ^ 0xFFFF_FFFF_FFFF_FFFF
    return _TIME_BE.unpack(_ORDER.pack(bits))[0]  # type: ignore[no-any-return]


def expiry_key(entry: bytes) -> str:
    return sys.intern(entry[8:].decode())


def split_key(key: str) -> tuple[str, str]:
    cluster, _, pod = key.partition("\0")
    return cluster, pod
