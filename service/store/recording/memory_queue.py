"""The decisions in memory: bounded in bytes (and optionally in count).

The hot path (``submit``) appends and adds up an estimate of what each row holds
(``row_bytes``); past the budget it refuses the new decision (its answer then says
``recorded: false``) and keeps every one already acknowledged. The writer
takes batches out (``take_batch``), puts back what it could not place (``put_back``)
and says where the rest went (``settle``): written, refused by the store, or spilled.
Every decision queued ends in exactly one of those counts or a drop at shutdown, which
is what ``settled`` adds up and a flush waits for.

Drops are counted (``switchboard_decisions_dropped_total``) and logged as one line
with the counts, at most every ``DROP_LOG_S``, never once per decision.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence

from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.rows import Decision as Row

log = logging.getLogger("switchboard.recorder")

MIB = 2**20
DROP_LOG_S = 5.0  # drops are logged at most this often, one line with the counts

_ROW_FIXED = 144 + 8 + 48 + 4 * 64
"""What every buffered row costs before the characters of its own strings: the 12-slot
tuple (136 bytes, 144 as allocated), its deque slot, the ``created_at`` datetime, and
four string objects (id, cluster, node, pod: 49 bytes of header each, rounded up)."""
_SHARED_ENTRY = 64 + 64
"""A shape or answer text counted once: its object's header and its id's set slot."""


def _chars(text: str | None) -> int:
    if text is None:
        return -64  # no string object
    return len(text) if text.isascii() else 4 * len(text) + 24


def row_bytes(row: Row) -> int:
    """What one buffered row costs in memory, not counting the shape and answer texts.

    Those two (a few KB) are shared by every decision of one shape or answer (the
    selector hands out the same strings), so they are counted once per distinct id
    while buffered (``MemoryQueue.submit``). The backend, source and revision are
    shared constants. Cluster and node names are counted per row although the JSON
    parser often shares them too: the estimate errs on the safe side (measured against
    RSS in tests/reliability/test_durability.py). Lengths, not ``sys.getsizeof``: this
    runs on the hot path, and getsizeof costs four times as much."""
    node, pod = row.node, row.pod
    size = _ROW_FIXED + len(row.id) + len(row.cluster)
    size += -64 if node is None else len(node) if node.isascii() else 4 * len(node) + 24
    return size + (-64 if pod is None else len(pod) if pod.isascii() else 4 * len(pod) + 24)


def _shared_bytes(text: str | None) -> int:
    return 0 if text is None else _SHARED_ENTRY + _chars(text)


class MemoryQueue:
    """``progress`` is notified whenever decisions settle: ``flush`` waits on it."""

    def __init__(
        self,
        metrics: Metrics,
        progress: threading.Condition,
        *,
        budget_bytes: int,
        limit: int | None = None,
    ) -> None:
        self._metrics = metrics
        self._progress = progress
        self.budget = budget_bytes
        self.limit = limit or sys.maxsize  # a count as well (SWITCHBOARD_BUFFER_LIMIT)
        self._count_limited = limit is not None
        self._queue: deque[Row] = deque()
        self._inflight: list[Row] = []
        self._take = threading.Lock()  # writer vs. stop: a batch is in the queue or in flight
        # Counters written by one thread each (no lock on the hot path): submit() owns
        # the memory taken in (``_in``, less what it dropped) and the hot drops, the
        # writer the memory released (``_out``) and the rest.
        self.submitted = 0
        self._in = 0
        self._hot_dropped = 0
        self._shared_seen: set[str] = set()
        self._out = 0
        self._in_limit = budget_bytes  # _out + the budget, kept by the writer
        self._written = 0
        self._refused = 0  # taken from memory, refused by the store, set aside
        self._spilled = 0
        self._dropped = 0
        self._drops_logged = 0
        self._drops_logged_at = 0.0

    # ------------------------------------------------------------ the hot path
    def submit(self, row: Row) -> bool:
        """Hot path: an append and a few additions, no lock, no I/O, no serialising.
        False: memory is at its budget, so the decision is not kept (counted as
        dropped) and its answer says so (``recorded: false``).

        The size is ``row_bytes`` written out (a call costs as much as the sum). The
        budget is reached only when the writer could not move the excess to the spill
        file (it tries from nine tenths of the budget on). The new decision is refused
        rather than an old one dropped: an old one's answer already gave its id to a
        pod, which would report on a decision that is gone."""
        node, pod = row.node, row.pod
        size = _ROW_FIXED + len(row.id) + len(row.cluster)
        size += -64 if node is None else len(node) if node.isascii() else 4 * len(node) + 24
        size += -64 if pod is None else len(pod) if pod.isascii() else 4 * len(pod) + 24
        seen = self._shared_seen
        if row.shape_id not in seen or row.answer_id not in seen:
            size += self._count_shared(seen, row)
        queue = self._queue
        if self._in + size > self._in_limit or (self._count_limited and len(queue) >= self.limit):
            self._hot_dropped += 1
            self._metrics.decisions_dropped.inc()
            return False
        self._in += size
        queue.append(row)
        self.submitted += 1
        return True

    def _count_shared(self, seen: set[str], row: Row) -> int:
        """A shape or answer text not yet counted while buffered: its bytes, once."""
        added = 0
        for key, text in ((row.shape_id, row.shape_json), (row.answer_id, row.answer_json)):
            if key not in seen:
                seen.add(key)
                added += _shared_bytes(text)
        return added

    # ------------------------------------------------------------ state
    @property
    def queued(self) -> int:
        """Decisions waiting in the queue (not counting a batch in flight)."""
        return len(self._queue)

    @property
    def pending(self) -> int:
        """Decisions in memory, not yet stored or spilled."""
        return len(self._queue) + len(self._inflight)

    @property
    def buffered_bytes(self) -> int:
        """The estimated memory the decisions in memory hold (``row_bytes``)."""
        return self._in - self._out

    def over_share(self, share: float) -> bool:
        """Memory holds more than ``share`` of the budget."""
        return self.buffered_bytes > self.budget * share

    def settled(self) -> int:
        """Decisions that left memory one way or another: what a flush waits for."""
        return self._written + self._refused + self._spilled + self._dropped

    def settled_prefix(self) -> int:
        """How many decisions, counted from the first submitted, left memory for good
        (what the journal may forget). The queue is first in, first out, and only the
        writer takes from it: what is neither queued nor in flight has settled. Read
        in an order that errs low when a submit runs meanwhile."""
        with self._take:
            submitted = self.submitted
            left = len(self._queue) + len(self._inflight)
        return submitted - left

    # ------------------------------------------------------------ the writer's side
    def take_batch(self, n: int) -> list[Row]:
        """Up to ``n`` of the oldest, now in flight (``put_back`` or ``settle`` them)."""
        with self._take:
            batch: list[Row] = []
            queue = self._queue
            while queue and len(batch) < n:
                batch.append(queue.popleft())
            self._inflight = batch
        return batch

    def put_back(self, rows: list[Row] | None = None) -> None:
        """Rows (by default the whole batch in flight) first in line again."""
        with self._take:
            self._queue.extendleft(reversed(self._inflight if rows is None else rows))
            self._inflight = []

    def settle(
        self, rows: Sequence[Row], *, written: int = 0, refused: int = 0, spilled: int = 0
    ) -> None:
        """Rows that left memory: written to the store, refused by it (set aside), or
        appended to the spill file."""
        with self._take:
            self._inflight = []
            empty = not self._queue
        if empty:
            # Nothing in memory: the estimate is zero, shapes and answers included,
            # without adding up the rows (the common case, every flush interval). A
            # row submitted at this instant may be missed until the next time; it is
            # half a KB.
            self._shared_seen = set()
            self._out = self._in
        else:
            self._out += sum(row_bytes(r) for r in rows)
        self._in_limit = self._out + self.budget
        if written:
            self._metrics.decisions_written.inc(written)
        with self._progress:
            self._written += written
            self._refused += refused
            self._spilled += spilled
            self._progress.notify_all()

    # ------------------------------------------------------------ stop
    def take_all(self) -> list[Row]:
        """Everything in memory, the batch in flight first, out of the queue."""
        with self._take:
            rows = [*self._inflight, *self._queue]
            self._queue.clear()
            self._inflight = []
        return rows

    def forget_all(self) -> None:
        """Nothing is left in memory: the estimate is zero."""
        self._out = self._in

    def drop(self, n: int, why: str) -> None:
        """``n`` decisions the store and the spill file could not take at shutdown."""
        self._dropped += n
        self._metrics.decisions_dropped.inc(n)
        log.error("dropped %d decisions at shutdown: the store could not take them and %s", n, why)
        self._drops_logged += n

    def log_drops(self, spill_error: str | None, *, force: bool = False) -> None:
        """One line with the counts, at most every ``DROP_LOG_S``, never one per drop."""
        dropped = self._dropped + self._hot_dropped
        new = dropped - self._drops_logged
        now = time.monotonic()
        if not new or (not force and now - self._drops_logged_at < DROP_LOG_S):
            return
        self._drops_logged = dropped
        self._drops_logged_at = now
        log.error(
            "dropped %d decisions: memory was at its budget (%.4g MB, "
            "SWITCHBOARD_BUFFER_LIMIT_MB) and the spill file could not take them (%s); "
            "%d dropped since start",
            new,
            self.budget / MIB,
            spill_error or "the writer fell behind",
            dropped,
        )
