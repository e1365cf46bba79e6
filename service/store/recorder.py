"""Decisions recorded without ``/v1/select`` ever waiting on a disk or the database.

One design (docs/reliability.md, *Recording decisions*):

* Every decision gets a **position** (consecutive, across restarts) and goes to the
  **log** (``recording/log.py``): on local disk within a few ms, one write and one
  fdatasync per batch. A crash loses only the batch not yet synced.
* One **drainer** thread copies decisions into the database in batches and advances
  the **mark**: every position up to it is stored (kept durably in the log's
  directory, so a restart knows where to resume and what is missing).
* **Memory** holds what readers need: the decisions not yet stored, in position order,
  and each named pod's newest position. The drainer takes its batches from there;
  decisions that left memory (past its budget, once in the log) or that a restart
  found in the log are read back from the log.
* "Is decision X stored?" is ``position <= mark`` (``wait_stored``): a report waits
  for its own decision's position to pass the mark, never for a flush and a query.
  Each waiter is woken by the batch that stores its position (a wake-up keyed by
  position), not by every batch nor at the drainer's interval.

Past the memory budget a decision already on disk leaves memory; one that is not, and
any decision while the log is over its size limit, is refused (its answer says
``recorded: false``): an acknowledged decision is never dropped.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from itertools import count, islice
from pathlib import Path

from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.deadline import StoreTimeout, serving_a_write
from mla_switchboard.service.store.decisions import DecisionStore
from mla_switchboard.service.store.recording.drainer import Drainer
from mla_switchboard.service.store.recording.log import SEGMENT_BYTES, DecisionLog
from mla_switchboard.service.store.recording.segments import Reader
from mla_switchboard.service.store.rows import Decision as Row

log = logging.getLogger("switchboard.recorder")

MIB = 2**20
DEFAULT_BUDGET_BYTES = 128 * MIB
DEFAULT_LOG_LIMIT_BYTES = 512 * MIB
ROW_BYTES = 700
"""What a decision in memory costs, on average (a 14-field tuple, its strings and its
slots; the shape and answer texts are shared): the budget in rows is the bytes over it."""
START_REPLAY_S = 10.0  # how long a start stores what the log holds before it serves
REFUSED_LOG_S = 5.0  # refused decisions are logged at most this often, as one line


class DecisionsNotStored(StoreTimeout):
    """A read found decisions this replica acknowledged not yet in the database and
    could not wait for them: it answers 503 rather than leave them out."""

    def __init__(self, waiting: int, why: str | None, waited_s: float | None) -> None:
        """``why``: the drainer's state when it is failing or stalled; ``waited_s``:
        how long the read waited (None: not at all, the database refuses writes)."""
        if waited_s is None:
            state, detail = f"store unavailable ({why})", ""
        else:
            state, detail = (
                f"store did not answer within {waited_s:g} s",
                f" ({why})" if why else "",
            )
        undone = "nothing was changed" if serving_a_write() else "nothing was read"
        super().__init__(
            f"{state}, {undone}: {waiting:,} decisions this replica answered are "
            f"not yet in the database{detail}, and an answer now would leave them out",
            outcome_unknown=False,
            retry_after_s=2,
        )
        self.waiting = waiting


class DecisionRecorder:
    def __init__(
        self,
        store: DecisionStore,
        metrics: Metrics,
        *,
        interval_s: float,
        batch: int,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        limit: int | None = None,
        log_dir: Path | None = None,
        log_limit_bytes: int = DEFAULT_LOG_LIMIT_BYTES,
        shutdown_flush_s: float = 5.0,
        stall_s: float | None = None,
        segment_bytes: int = SEGMENT_BYTES,
        read_wait_s: float = 4.0,
    ) -> None:
        """``log_dir`` None: no log (memory alone, as ``SWITCHBOARD_JOURNAL=0``);
        ``stall_s``: the least time a database write may be in flight before
        ``degraded`` says it stalled (``Drainer.stall_bound``); ``read_wait_s``: how
        long a read waits for the decisions answered before it (``settle_for_read``)."""
        self._metrics = metrics
        self._interval = interval_s
        self._batch = batch
        self._max_rows = max(1, budget_bytes // ROW_BYTES)
        if limit is not None:
            self._max_rows = min(self._max_rows, limit)
        self._log_limit = log_limit_bytes
        self._shutdown_flush_s = shutdown_flush_s
        self._read_wait_s = read_wait_s
        self.log = (
            DecisionLog(log_dir, metrics, segment_bytes=segment_bytes)
            if log_dir is not None
            else None
        )
        self._log_submit = None
        self._reader: Reader | None = None
        self._drainer = Drainer(store, metrics, interval_s, stall_s)
        self._lock = threading.Lock()  # positions, memory and the pods' index
        self._memory: deque[tuple[int, Row]] = deque()
        self._by_pod: dict[tuple[str, str], int] = {}
        self._by_id: dict[str, int] = {}  # each decision not yet stored, by its id
        self._head = 0  # the newest position given
        self.mark = 0  # every position up to it is in the database
        self.stored = 0  # decisions this recorder stored
        self.refused = 0  # decisions it could not keep (their answers said so)
        self._refused_logged = 0
        self._refused_logged_at = 0.0
        self._log_full = False
        # (position, tie, event) of each writer waiting for a position: the batch that
        # stores it sets its event (``_advance``), no other batch wakes it
        self._waiters: list[tuple[int, int, threading.Event]] = []
        self._waiters_lock = threading.Lock()
        self._tie = count()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ the hot path
    def submit(self, row: Row) -> bool:
        """A position, an append to memory and one to the log's queue. False: not kept
        (memory full of decisions not yet on disk, or the log at its size limit); the
        answer says so, and no acknowledged decision is ever dropped for it."""
        with self._lock:
            memory = self._memory
            if (len(memory) >= self._max_rows and not self._evict()) or self._log_full:
                self._metrics.decisions_dropped.inc()
                self.refused += 1
                return False
            seq = self._head = self._head + 1
            memory.append((seq, row))
            if self._log_submit is not None:
                self._log_submit((seq, row))
            if row.pod:
                self._by_pod[(row.cluster, row.pod)] = seq
            self._by_id[row.id] = seq
        return True

    def _evict(self) -> bool:
        """Memory at its budget: the oldest decisions already on disk leave it (the
        drainer reads them back from the log). False when none could."""
        if self.log is None or self.log.error is not None:
            return False
        durable, memory = self.log.evictable, self._memory
        evicted = 0
        while memory and memory[0][0] <= durable and evicted < self._batch:
            memory.popleft()
            evicted += 1
        return evicted > 0

    # ------------------------------------------------------------ what readers ask
    @property
    def head(self) -> int:
        """The newest position given."""
        return self._head

    @property
    def pending(self) -> int:
        """Decisions given a position, not yet in the database."""
        return self._head - self.mark

    @property
    def buffered_bytes(self) -> int:
        """The estimated memory the decisions in memory hold (``ROW_BYTES`` each)."""
        return len(self._memory) * ROW_BYTES

    def position_of(self, cluster: str, pod: str) -> int | None:
        """The position of the pod's newest decision not yet stored; None when it has
        none waiting (it is in the database, or there never was one)."""
        return self._by_pod.get((cluster, pod))

    def logged_decision(self, cluster: str, pod: str) -> Row | None:
        """The pod's newest decision while it is not yet stored and memory still holds
        it; None otherwise (stored, only in the log, or never made). It is in the log:
        acknowledged, and what it says is final, so a report can be counted against it
        without waiting for the database."""
        with self._lock:
            seq = self._by_pod.get((cluster, pod))
            memory = self._memory
            if seq is None or not memory:
                return None
            i = seq - memory[0][0]  # memory holds consecutive positions
            if 0 <= i < len(memory) and memory[i][0] == seq:
                return memory[i][1]
        return None

    def position_of_decision(self, decision_id: str) -> int | None:
        """The position of a decision this recorder gave and has not yet stored; None
        when it is stored, or was given before this start (the log's leftovers)."""
        return self._by_id.get(decision_id)

    def wait_stored(self, position: int, timeout_s: float, *, wake: bool = True) -> bool:
        """Wait until every decision up to ``position`` is in the database, at most
        ``timeout_s``; woken by the batch that stores ``position``, however many
        batches end before it. ``wake=False``: leave the drainer to its interval, so
        that a client looping on a read costs no extra, smaller batches."""
        if position <= self.mark:
            return True
        return self._wait_own(position, timeout_s, wake)

    def settle_for_read(self, *, wake: bool = True) -> None:
        """Before a read of the database: wait until every decision answered before it
        is stored, so the read holds them. A read never answers without decisions this
        replica acknowledged: when the drainer's writes fail, or they are not stored
        within ``read_wait_s`` (the request's store deadline: a frozen or overloaded
        database), it raises ``DecisionsNotStored`` (503 with Retry-After) instead.
        A slow write is waited for, not judged by the stall bound: on a busy machine a
        healthy database's write can outlast it."""
        position = self._head
        if position <= self.mark:
            return
        if self._drainer.down is not None:
            raise DecisionsNotStored(position - self.mark, self._drainer.down, None)
        if not self.wait_stored(position, self._read_wait_s, wake=wake):
            raise DecisionsNotStored(position - self.mark, self.degraded, self._read_wait_s)

    def _wait_own(self, position: int, timeout_s: float, wake: bool) -> bool:
        event = threading.Event()
        entry = (position, next(self._tie), event)
        with self._waiters_lock:
            if position <= self.mark:  # ``_advance`` moves the mark before it wakes
                return True
            heapq.heappush(self._waiters, entry)
        if wake:
            self._wake.set()
        if event.wait(timeout_s):
            return True
        with self._waiters_lock:
            if not event.is_set():
                self._waiters.remove(entry)
                heapq.heapify(self._waiters)
        return position <= self.mark

    def flush(self, timeout_s: float = 3.0, *, wake: bool = True) -> bool:
        """Wait until everything given a position before this call is stored (see
        ``wait_stored``)."""
        return self.wait_stored(self._head, timeout_s, wake=wake)

    @property
    def degraded(self) -> str | None:
        """Why the database is not taking decisions now; None when it is."""
        return self._drainer.degraded

    @property
    def attempts(self) -> int:
        """Database writes tried (the backoff test counts them)."""
        return self._drainer.attempts

    @property
    def log_error(self) -> str | None:
        """Why the log cannot keep decisions now ("off" when there is none)."""
        if self.log is None:
            return "off: no decision log (SWITCHBOARD_JOURNAL=0 or SWITCHBOARD_SPILL_LIMIT_MB=0)"
        if self._log_full:
            return f"full: the log holds {self._log_limit // MIB} MB not yet stored"
        return self.log.error

    @property
    def log_damage(self) -> str | None:
        """What the start found missing from the log; None when nothing was."""
        return None if self.log is None else self.log.damage

    def log_bytes(self) -> int:
        return 0 if self.log is None else self.log.size()

    def backlog(self) -> str | None:
        """What ``/readyz`` says while the log holds decisions not yet stored, e.g.
        ``holding 60,000 decisions not yet stored``; None when the drainer keeps up."""
        waiting = self.pending
        if waiting < max(self._batch, 1) * 2:
            return None
        verb = "draining" if self._drainer.degraded is None else "holding"
        return f"{verb} {waiting:,} decisions not yet stored"

    # ------------------------------------------------------------ start, stop
    def open(self, budget_s: float = START_REPLAY_S) -> int:
        """At start, before serving: open the log (saying what is missing from it) and
        store what it holds past the mark, for at most ``budget_s``; the drainer goes
        on with the rest. Returns the number of decisions stored meanwhile."""
        if self.log is None:
            return 0
        found = self.log.open()
        if found is None:
            return 0
        self.mark, self._head = found.mark, found.last
        self._reader = Reader(self.log.dir)
        self._log_submit = self.log.submit
        before, until = self.stored, time.monotonic() + budget_s
        while self.mark < self._head and time.monotonic() < until:
            if not self._step() or self._drainer.down:
                break
        if self.mark < self._head:
            log.warning(
                "stored %d logged decisions at start; the other %d follow in the background",
                self.stored - before,
                self._head - self.mark,
            )
        return self.stored - before

    def start(self) -> None:
        if self.log is not None:
            self.log.start()
        self._thread = threading.Thread(target=self._run, name="decision-drainer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Store what the database takes within ``shutdown_flush_s``; the log keeps
        the rest for the next start. Both threads end; refusals not yet told are
        (the last line then carries the total)."""
        self._log_refusals(force=True)
        if self._drainer.degraded is None:
            self.flush(self._shutdown_flush_s)
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self._shutdown_flush_s + 1.0)
            if self._thread.is_alive():
                log.warning("the drainer's database write in flight has not ended: left to it")
            self._thread = None
        waiting = self._head - self.mark
        if self.log is not None and self.log.error is None and self._log_submit is not None:
            self.log.stop(self.mark)
            if waiting:
                log.warning(
                    "%d decisions not yet stored stay in the log (%s) for the next start",
                    waiting,
                    self.log.dir,
                )
        elif waiting:
            self._metrics.decisions_dropped.inc(waiting)
            log.error(
                "dropped %d decisions at shutdown: the store could not take them and there "
                "is no decision log (%s)",
                waiting,
                self.log_error,
            )

    # ------------------------------------------------------------ the drainer thread
    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            wait = self._drainer.retry_at - time.monotonic()
            if self._drainer.down and wait > 0 and self._stopping.wait(wait):
                return
            try:
                while self._step() and not self._stopping.is_set():
                    pass
                if self.log is not None:
                    self._log_full = self.log.size() > self._log_limit
                self._log_refusals()
            except Exception:  # the drainer must outlive a bug in one step
                log.exception("decision drainer: unexpected error (retrying)")
                self._stopping.wait(0.1)

    def _log_refusals(self, *, force: bool = False) -> None:
        """One line with the counts, at most every ``REFUSED_LOG_S`` (``force``: now,
        at stop), never one per decision."""
        new = self.refused - self._refused_logged
        now = time.monotonic()
        if not new or (not force and now - self._refused_logged_at < REFUSED_LOG_S):
            return
        self._refused_logged, self._refused_logged_at = self.refused, now
        log.error(
            "dropped %d decisions (answered recorded: false): memory was at its budget "
            "(%.4g MB, SWITCHBOARD_BUFFER_LIMIT_MB) and the log could not take them (%s); "
            "%d dropped since start",
            new,
            self._max_rows * ROW_BYTES / MIB,
            self.log_error or "not yet on disk",
            self.refused,
        )

    def _step(self) -> bool:
        """One batch from the mark on into the database; False when there was none or
        the database failed."""
        batch = self._next_batch()
        if not batch:
            return False
        if not self._drainer.write([row for _, row in batch]):
            return False
        self.stored += len(batch)
        with self._lock:  # stored, whether memory or the log held it
            by_id = self._by_id
            for seq, row in batch:
                if by_id.get(row.id) == seq:
                    del by_id[row.id]
        self._advance(batch[-1][0])
        return True

    def _next_batch(self) -> list[tuple[int, Row]]:
        start = self.mark + 1
        with self._lock:
            memory = self._memory
            in_memory = memory[0][0] if memory else self._head + 1
            if start >= in_memory:
                return list(islice(memory, self._batch))
        if self._reader is None:
            return []
        rows = self._reader.read(start, in_memory - 1, self._batch)
        if not rows:  # lost before this start (reported by the log): nothing to store
            self._advance(in_memory - 1)
        return rows

    def _advance(self, mark: int) -> None:
        with self._lock:
            memory, by_pod = self._memory, self._by_pod
            while memory and memory[0][0] <= mark:
                seq, row = memory.popleft()
                if row.pod and by_pod.get((row.cluster, row.pod)) == seq:
                    del by_pod[(row.cluster, row.pod)]
            self.mark = max(self.mark, mark)
        with self._waiters_lock:
            waiters = self._waiters
            while waiters and waiters[0][0] <= self.mark:
                heapq.heappop(waiters)[2].set()
        if self.log is not None:
            self.log.stored(self.mark)
