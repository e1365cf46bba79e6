"""The decision log: every answered decision on local disk within a few milliseconds.

The hot path appends ``(position, row)`` to a deque (``submit``: one append). A thread
of the log's own takes whatever is there every ``LOG_INTERVAL_S`` and writes it with
one ``write`` and one ``fdatasync`` per batch (group commit, as databases do for their
logs), so a sync is shared by every decision of the batch and none is on the select
path. Records and segments are described in ``segments.py``; a new segment is written
under a temporary name, synced, renamed, and the directory synced, so a segment that
exists always begins with its header.

The drainer (``recorder.py``) stores what the log holds and tells the log how far it
got (``stored``): the mark is written durably, then every segment wholly below it is
removed. At start ``open`` reads the mark and the segments and says what is missing
(a log line, ``switchboard_decisions_lost_total``, and ``damage`` for ``/readyz``).

One process writes a log directory (an ``flock`` on ``<dir>/lock``): replicas sharing a
spill path take ``<dir>``, ``<dir>.1``, ... (the first free), so a replica started
after one died takes over its log. A log that cannot write (a full disk) says why
(``error``) and keeps trying: the decisions are still in memory, and the drainer
stores them from there.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path

from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.recording.segments import (
    Encoder,
    Scan,
    scan,
    segment_name,
    sync_directory,
    write_mark,
)
from mla_switchboard.service.store.rows import Decision as Row
from prometheus_client import Counter

log = logging.getLogger("switchboard.recorder")

LOG_INTERVAL_S = 0.003  # a batch every few ms: what a crash can lose
SEGMENT_BYTES = 16 * 2**20  # a segment takes new records up to this size ...
SEGMENT_S = 10.0  # ... or this long, then the next one starts (so a stored one can go)
MAX_BATCH = 20_000  # decisions encoded and written at once
SLOTS = 16  # replicas that may share one spill path, each with a log directory of its own


def describe(exc: BaseException) -> str:
    """An OS error without the file name (``/readyz`` is open to anyone)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return type(exc).__name__


class DecisionLog:
    def __init__(
        self,
        directory: Path,
        metrics: Metrics,
        *,
        interval_s: float = LOG_INTERVAL_S,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        self.dir = directory
        self._queue: deque[tuple[int, Row]] = deque()
        self.submit = self._queue.append  # the hot path: one append
        self._interval = interval_s
        self._segment_bytes = segment_bytes
        self._encoder = Encoder()
        # closed segments and the current one: [first, last, size, path]
        self._segments: deque[list] = deque()
        self._lock = threading.Lock()  # the segments: the log thread vs. ``stored``
        self._fd: int | None = None
        self._opened_at = 0.0
        self._dir_lock: int | None = None
        self.durable = 0  # the newest position synced to disk
        # positions whose batch could not be written (first, last): not in the log,
        # so memory must keep them until they are stored
        self._unwritten: tuple[int, int] | None = None
        self.error: str | None = None
        self.damage: str | None = None  # what the start found missing, for /readyz
        self._mark_written = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        r = metrics.registry
        self._batches = Counter(
            "switchboard_decision_log_batches",
            "Batches appended to the decision log (one write and fdatasync each)",
            registry=r,
        )
        self._failed = Counter(
            "switchboard_decision_log_failed",
            "Decisions the log could not write (a full disk): kept in memory only",
            registry=r,
        )
        self._lost = Counter(
            "switchboard_decisions_lost",
            "Decisions found missing from the log at start (a segment deleted, emptied or "
            "damaged before they were stored)",
            registry=r,
        )

    # ------------------------------------------------------------ start, stop
    def open(self) -> Scan | None:
        """At start: take the directory, read the mark and the segments, and say what
        is missing. None (and ``error``) when the log cannot be used; never raises."""
        try:
            fd = self._take_slot()
            if fd is None:
                self.error = "another process writes each of this path's decision logs"
                log.error("%s (%s): decisions are kept in memory only", self.error, self.dir)
                return None
            self._dir_lock = fd
            found = scan(self.dir)
        except OSError as exc:
            self.error = describe(exc)
            log.error("the decision log cannot be read (%s): in memory only", self.error)
            return None
        for seg in found.segments:
            self._segments.append([seg.first, seg.last, seg.size, seg.path])
        self._mark_written = found.mark
        self.durable = found.last
        self._report(found)
        return found

    def _take_slot(self) -> int | None:
        """The first of ``<dir>``, ``<dir>.1`` ... ``<dir>.<SLOTS - 1>`` no live process
        holds, locked (replicas sharing a path each take one; a start takes over the
        log of a process that died, and stores it). None when every one is held."""
        base = self.dir
        for i in range(SLOTS):
            candidate = base if i == 0 else base.with_name(f"{base.name}.{i}")
            candidate.mkdir(parents=True, exist_ok=True)
            fd = os.open(candidate / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.dir = candidate
            return fd
        return None

    def _report(self, found: Scan) -> None:
        if not found.losses:
            return
        lost = found.lost
        if lost:
            self._lost.inc(lost)
        count = "an unknown number of" if lost is None else f"{lost}"
        self.damage = f"{count} decisions lost from the log: " + "; ".join(
            why if n is None else f"{why} ({n} lost)" for why, n in found.losses
        )
        log.error("%s (in %s)", self.damage, self.dir)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="decision-log", daemon=True)
        self._thread.start()

    def stop(self, mark: int) -> None:
        """Write what is queued, the mark, remove what is stored; close."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None
        self._write_batch()
        self.stored(mark, force=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._dir_lock is not None:
            os.close(self._dir_lock)
            self._dir_lock = None

    def size(self) -> int:
        """Bytes the segments hold (stored or not yet)."""
        with self._lock:
            return sum(seg[2] for seg in self._segments)

    @property
    def evictable(self) -> int:
        """Every position up to this one is on disk (memory may let it go): the
        newest synced, but below a batch that could not be written until it is stored."""
        unwritten = self._unwritten
        return self.durable if unwritten is None else min(self.durable, unwritten[0] - 1)

    @property
    def first(self) -> int | None:
        """The oldest position a segment holds; None when the log holds none."""
        with self._lock:
            return self._segments[0][0] if self._segments else None

    # ------------------------------------------------------------ the drainer's side
    def stored(self, mark: int, *, force: bool = False) -> None:
        """Every decision up to ``mark`` is in the database. When that lets a closed
        segment go (or ``force``, at stop): write the mark, then remove the segments
        it passed. Removed only after the mark is on disk, so a start never takes a
        stored segment's absence for a loss. The mark is not written for every batch:
        each write is a file and a directory sync, which on a busy disk delays the
        log's own syncs; a start finding an older mark stores again what the database
        already has, which inserts skip."""
        unwritten = self._unwritten
        if unwritten is not None and mark >= unwritten[1]:
            self._unwritten = None
        if mark <= self._mark_written or self._dir_lock is None:
            return
        with self._lock:
            segs = self._segments
            passed = len(segs) > 1 and segs[0][1] <= mark
        if not passed and not force:
            return
        try:
            write_mark(self.dir, mark)
        except OSError as exc:
            self._failing(exc)
            return
        self._mark_written = mark
        with self._lock:
            gone = []
            while len(self._segments) > 1 and self._segments[0][1] <= mark:
                gone.append(self._segments.popleft()[3])
        for path in gone:
            with contextlib.suppress(OSError):
                path.unlink()

    # ------------------------------------------------------------ the log thread
    def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self._write_batch()
            except Exception:  # the log must outlive a bug in one batch
                log.exception("decision log: unexpected error (retrying)")
                time.sleep(0.1)
            rest = self._interval - (time.monotonic() - started)
            if rest > 0:
                self._stopping.wait(rest)

    def _write_batch(self) -> None:
        queue = self._queue
        n = min(len(queue), MAX_BATCH)
        if not n or self._dir_lock is None:
            if self._dir_lock is None:
                queue.clear()  # no log: memory alone keeps them
            return
        batch = [queue.popleft() for _ in range(n)]
        try:
            self._append(batch)
        except OSError as exc:
            self._failed.inc(n)
            self._failing(exc)
            first, last = batch[0][0], batch[-1][0]
            was = self._unwritten
            self._unwritten = (first, last) if was is None else (was[0], max(was[1], last))
            return
        if self.error is not None:
            log.warning("the decision log writes again")
            self.error = None
        self._batches.inc()

    def _append(self, batch: list[tuple[int, Row]]) -> None:
        fd, seg = self._current(batch[0][0])
        data = self._encoder.batch(batch)
        try:
            _write_all(fd, data)
            os.fdatasync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, seg[2])  # never half a batch: records stay whole
            # the texts this batch would have carried are not in the segment
            self._close_current()
            raise
        with self._lock:
            seg[1], seg[2] = batch[-1][0], seg[2] + len(data)
        self.durable = batch[-1][0]

    def _current(self, first: int) -> tuple[int, list]:
        """The segment taking new records: a new one (synced with its directory) after
        ``SEGMENT_BYTES`` or ``SEGMENT_S``."""
        if self._fd is not None and self._segments:
            seg = self._segments[-1]
            if seg[2] < self._segment_bytes and time.monotonic() - self._opened_at < SEGMENT_S:
                return self._fd, seg
            self._close_current()
        path = self.dir / segment_name(first)
        tmp = self.dir / (path.name + ".tmp")
        head = self._encoder.new_segment(first)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, head)
            os.fdatasync(fd)
            os.replace(tmp, path)
            sync_directory(self.dir)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self._fd, self._opened_at = fd, time.monotonic()
        seg = [first, first - 1, len(head), path]
        with self._lock:
            self._segments.append(seg)
        return fd, seg

    def _close_current(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _failing(self, exc: OSError) -> None:
        reason = describe(exc)
        if reason != self.error:
            log.error(
                "the decision log cannot write (%s): decisions are kept in memory until "
                "the database takes them",
                reason,
            )
        self.error = reason


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
