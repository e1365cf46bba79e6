"""The journal: every acknowledged decision on local disk within a few milliseconds.

The memory queue alone loses what a crash finds in it, and how much that is depends on
the database writer: a store that hangs holds a batch in flight until the stall bound,
a saturated machine delays every batch. The journal does not wait for any of that. The
hot path appends each row to a deque (``submit``: one append); a thread of its own takes
whatever is there every ``JOURNAL_INTERVAL_S`` and writes it with one ``write`` and one
``fdatasync`` per batch (group commit, as databases do for their logs), so the cost of
a sync is shared by every decision of the batch and none is on the select path.

Lines are spill lines (``spill.LineEncoder``), in segments named
``<spill>.journal-<pid>-<ns>-<n>`` and held under ``flock`` while this process
lives. A segment is removed once every decision in it left memory for good (stored,
spilled, set aside or dropped: ``MemoryQueue.settled_prefix``). A segment whose lock is
free belongs to a process that died: the spill drain takes it as it takes a drain left
unfinished (``SpillFile.claim``: a ``.replay-*`` or ``.journal-*`` file whose lock it
can take), and writes it
into the store at the next start, or on any replica sharing the path, idempotently
(inserts skip known decision ids).

A journal that cannot write (a full disk) says why (``error``) and keeps going: the
decisions are still in memory and written by the writer as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.rows import Decision as Row
from mla_switchboard.service.store.spill import LineEncoder, describe
from prometheus_client import Counter

log = logging.getLogger("switchboard.recorder")

JOURNAL_INTERVAL_S = 0.003  # a batch every few ms: what a crash can lose
SEGMENT_S = 1.0  # a segment takes new lines this long ...
SEGMENT_BYTES = 16 * 2**20  # ... or up to this size, then the next one starts
MAX_BATCH = 20_000  # rows encoded and written at once
JOURNAL_MARK = ".journal-"


@dataclass
class _Segment:
    path: Path
    fd: int
    start: int  # index (in submit order) of its first decision
    end: int  # one past its last
    opened_at: float
    size: int = 0


class Journal:
    """``settled_prefix``: how many decisions, counted from the first submitted, have
    left memory for good; a segment whose decisions all did is removed."""

    def __init__(
        self,
        spill_path: Path,
        metrics: Metrics,
        settled_prefix: Callable[[], int],
        *,
        interval_s: float = JOURNAL_INTERVAL_S,
    ) -> None:
        self._dir = spill_path.parent
        self.prefix = f"{spill_path.name}{JOURNAL_MARK}{os.getpid()}-{time.time_ns()}-"
        self._queue: deque[Row] = deque()
        self.submit: Callable[[Row], None] = self._queue.append  # the hot path: one append
        self._settled_prefix = settled_prefix
        self._interval = interval_s
        self._encoder = LineEncoder()
        self._segments: deque[_Segment] = deque()  # the last one takes new lines
        self._n = 0
        self.journaled = 0  # decisions taken from the deque (written, or not: ``error``)
        self.error: str | None = None
        self._stopping = threading.Event()
        self._held = False  # no segment is removed until ``stop``
        self._thread: threading.Thread | None = None
        r = metrics.registry
        self._batches = Counter(
            "switchboard_journal_batches",
            "Batches appended to the decision journal (one write and fdatasync each)",
            registry=r,
        )
        self._lines = Counter(
            "switchboard_journal_lines",
            "Decisions appended to the journal (on disk within a few ms of their answer)",
            registry=r,
        )
        self._failed = Counter(
            "switchboard_journal_failed",
            "Decisions the journal could not write (a full disk): kept in memory only",
            registry=r,
        )

    # ------------------------------------------------------------ start, stop
    def start(self) -> None:
        """Never raises: a journal that cannot write says why (``error``), and the
        service answers with the writer and spill file alone."""
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.error = describe(exc)
            log.error("the decision journal cannot write (%s): it retries each batch", self.error)
        self._thread = threading.Thread(target=self._run, name="decision-journal", daemon=True)
        self._thread.start()

    def hold(self) -> None:
        """Remove no segment until ``stop``: the recorder is moving what is in memory
        to the spill file, out of the queue before it is in the file."""
        self._held = True

    def stop(self) -> None:
        """After the recorder stopped: write what is queued, remove what is settled
        (everything, after a clean stop); what is not stays for the next start."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self._write_batch()
        self._retire(final=True)
        for seg in self._segments:
            os.close(seg.fd)  # releases its lock: a drain may take it
        self._segments.clear()

    def own(self, path: Path) -> bool:
        """A file this process's journal writes (not a backlog to report)."""
        return path.name.startswith(self.prefix)

    def size(self) -> int:
        return sum(seg.size for seg in self._segments)

    # ------------------------------------------------------------ the journal thread
    def _run(self) -> None:
        last_retire = 0.0
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self._write_batch()
                if started - last_retire >= 0.05:
                    last_retire = started
                    self._retire()
            except Exception:  # the journal must outlive a bug in one batch
                log.exception("decision journal: unexpected error (retrying)")
                time.sleep(0.1)
            # one batch per interval at most: at full load a sync is shared by a few
            # ms of answers rather than taken for each handful
            rest = self._interval - (time.monotonic() - started)
            if rest > 0:
                time.sleep(rest)

    def _write_batch(self) -> None:
        queue = self._queue
        n = min(len(queue), MAX_BATCH)
        if not n:
            return
        rows = [queue.popleft() for _ in range(n)]
        data = b"".join(self._encoder.line(r) for r in rows)
        start = self.journaled
        self.journaled += n
        seg: _Segment | None = None
        try:
            seg = self._current(start)
            _write_all(seg.fd, data)
            os.fdatasync(seg.fd)
        except OSError as exc:
            self._failed.inc(n)
            if seg is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(seg.fd, seg.size)  # never half a batch: lines stay whole
            reason = describe(exc)
            if reason != self.error:
                log.error(
                    "the decision journal cannot write (%s): decisions are kept in memory "
                    "only until the store or the spill file takes them",
                    reason,
                )
            self.error = reason
            if self._segments:
                self._segments[-1].end = self.journaled
            return
        if self.error is not None:
            log.warning("the decision journal writes again")
            self.error = None
        seg.size += len(data)
        seg.end = self.journaled
        self._batches.inc()
        self._lines.inc(n)

    def _current(self, start: int) -> _Segment:
        """The segment taking new lines; a new one after ``SEGMENT_S`` or
        ``SEGMENT_BYTES`` (so that settled ones can be removed whole)."""
        now = time.monotonic()
        if self._segments:
            seg = self._segments[-1]
            if now - seg.opened_at < SEGMENT_S and seg.size < SEGMENT_BYTES:
                return seg
        self._n += 1
        path = self._dir / f"{self.prefix}{self._n}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a drain takes it only once this process is gone
        seg = _Segment(path, fd, start, start, now)
        self._segments.append(seg)
        return seg

    def _retire(self, *, final: bool = False) -> None:
        """Remove the segments whose decisions all left memory for good: unlinked
        before their lock is let go, so no drain takes them meanwhile."""
        if self._held and not final:
            return
        settled = self._settled_prefix()
        segs = self._segments
        while segs and segs[0].end <= settled:
            if len(segs) == 1 and not final and time.monotonic() - segs[0].opened_at < SEGMENT_S:
                return  # still taking lines
            seg = segs.popleft()
            with contextlib.suppress(OSError):
                seg.path.unlink()
            os.close(seg.fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
