"""Writes decisions in the background, in batches, so ``/v1/select`` never waits on disk.

Durability contract (docs/reliability.md):

* The store up: a decision is in memory when its answer is sent and in the database
  within ``interval_s``; a crash loses at most about one interval.
* The store down: every ``interval_s`` the writer appends what is in memory to the
  spill file (``spill.py``: one fsync per append), so a crash loses only the last
  interval here too. A spilled decision leaves memory; it is stored once, by whichever
  drain takes the file. The writer tries the store again with backoff (100 ms doubling
  to 2 s, however many readers wait for a flush); once it answers, the writer drains
  the spill file into it (this replica's and any other's on the same path), batch by
  batch, between batches of new decisions. A start drains whatever is left first.
* Memory is bounded in bytes (``budget_bytes``, an estimate of what each row really
  holds, see ``row_bytes``). Past about nine tenths of it (a store too slow, not
  down) the oldest go to the spill file. Only when the spill file cannot take them
  either (its size limit, a full or read-only disk) are the oldest dropped.
* A store that hangs rather than refuses is the same as one that is down: the store
  call runs on a thread of its own (``call_thread.py``), and once it has been in
  flight longer than writes have been taking (``_stall_bound``: at least 4 intervals,
  200 ms) the writer spills what is in memory, the batch in flight included, and goes
  on spilling every interval until that call ends.
  If it then commits, the same decisions are written again from the spill file, which
  is harmless: inserts skip known ids.

Every spill, replay, rejected line and drop is counted
(``switchboard_decisions_{spilled,replayed,rejected,dropped}_total``) and logged with
its count, never once per decision. The counts are exact: a decision is counted
written or replayed only once the store took it, and a row the store refuses only as
rejected.

The hot path hands over one named tuple per decision (``Row``: ``rows.Decision``, as
small as a plain tuple) and adds up its size; serialising and SQL happen here, on the
writer thread, in batches.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import psycopg
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.call_thread import Call, CallThread
from mla_switchboard.service.store.rows import Decision as Row
from mla_switchboard.service.store.spill import REJECTED_LIMIT_BYTES, Replay, SpillFile
from prometheus_client import Counter
from sqlalchemy.exc import DataError, IntegrityError

log = logging.getLogger("switchboard.recorder")

CONTENT_REFUSALS = (DataError, IntegrityError, psycopg.DataError, psycopg.IntegrityError)
"""The store refusing a batch for what it holds, not for being down. SQLAlchemy wraps
the driver's errors for the statements it runs; the PostgreSQL batch's ``COPY`` and
its statements go to psycopg directly, whose errors arrive unwrapped."""
MAX_BACKOFF_S = 2.0
MIB = 2**20
DEFAULT_BUDGET_BYTES = 128 * MIB
DEFAULT_SPILL_LIMIT_BYTES = 512 * MIB
SPILL_CHUNK = 5000  # rows encoded and appended at once (bounds the writer's own memory)
SPILL_MIN_CHUNK = 500  # ... and at least this many, whatever the flush batch: one fsync each
SPILL_RETRY_S = 1.0  # a spill file that refused is tried again this often, not every tick
SPILL_CHECK_S = 5.0  # how often a healthy writer looks for other replicas' spill files
DROP_LOG_S = 5.0  # drops are logged at most this often, one line with the counts
START_REPLAY_S = 10.0  # how long a start replays spill files before it serves
STALL_INTERVALS = 4  # a store write in flight this many flush intervals counts as stalled,
MIN_STALL_S = 0.2  # ... and at least this long,
STALL_FACTOR = 3  # ... or this many times the slowest of the last RECENT_WRITES writes,
RECENT_WRITES = 64
MAX_STALL_S = 2.0  # ... but never longer than this

# ------------------------------------------------------------ memory estimate

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
    while buffered (``DecisionRecorder.submit``). The backend, source and revision are
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


class DecisionRecorder:
    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        *,
        interval_s: float,
        batch: int,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        limit: int | None = None,
        spill_path: Path | None = None,
        spill_limit_bytes: int = DEFAULT_SPILL_LIMIT_BYTES,
        shutdown_flush_s: float = 5.0,
        stall_s: float | None = None,
        rejected_limit_bytes: int = REJECTED_LIMIT_BYTES,
    ) -> None:
        """``stall_s``: the least time a store write may be in flight before the
        writer spills what is in memory and counts the store as degraded (by default
        ``STALL_INTERVALS`` flush intervals, at least ``MIN_STALL_S``); see
        ``_stall_bound``.
        ``rejected_limit_bytes``: the most ``<spill>.rejected`` grows to."""
        self._db = store
        self._metrics = metrics
        self._interval = interval_s
        self._batch = batch
        self._budget = budget_bytes
        self._limit = limit or sys.maxsize  # a count as well (SWITCHBOARD_BUFFER_LIMIT)
        self.spill_path = spill_path
        self._spill = (
            SpillFile(spill_path, spill_limit_bytes, rejected_limit_bytes) if spill_path else None
        )
        self._shutdown_flush_s = shutdown_flush_s
        self._stall_floor = (
            stall_s if stall_s is not None else max(STALL_INTERVALS * interval_s, MIN_STALL_S)
        )
        self._recent_writes: deque[float] = deque(maxlen=RECENT_WRITES)  # seconds each
        self._stall_s = self._stall_floor  # the bound the last write was given
        self._calls = CallThread("decision-store")
        self._queue: deque[Row] = deque()
        self._inflight: list[Row] = []
        self._take = threading.Lock()  # writer vs. stop(): a batch is in the queue or in flight
        # Counters written by one thread each (no lock on the hot path): submit() owns
        # the memory taken in (``_in``, less what it dropped) and the hot drops, the
        # writer the memory released (``_out``) and the rest.
        self._submitted = 0
        self._in = 0
        self._hot_dropped = 0
        self._shared_seen: set[str] = set()
        self._out = 0
        self._in_limit = budget_bytes  # _out + the budget, kept by the writer
        self._count_limited = limit is not None
        self._written = 0
        self._refused = 0  # taken from memory, refused by the store, set aside
        self._spilled = 0
        self._dropped = 0
        self._drops_logged = 0
        self._drops_logged_at = 0.0
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._backoff = interval_s
        self._retry_at = 0.0
        self._degraded_since = 0.0
        self.attempts = 0  # store writes tried (the backoff test counts them)
        self.degraded: str | None = None  # why writes are failing, None when healthy
        # the spill file: why it cannot take decisions now (None: it can), when to retry
        self.spill_error: str | None = None if self._spill else "off: no spill path"
        self._spill_retry_at = 0.0
        self._spill_gen = 0  # appends this process made ...
        self._drained_gen = 0  # ... of which every one up to here is drained
        self._spilled_undrained = 0
        self._replay: Replay | None = None
        self._replayed = 0
        self._spill_off = spill_limit_bytes <= 0
        self._next_spill_check = 0.0
        self._drain_blocked_until = 0.0
        self._drain_error: str | None = None
        self._bug_logged_at = 0.0
        r = metrics.registry
        self._spilled_total = Counter(
            "switchboard_decisions_spilled",
            "Decisions appended to the spill file (the store could not take them, or memory "
            "was past its budget)",
            registry=r,
        )
        self._writer_cpu = Counter(
            "switchboard_decision_writer_cpu_seconds",
            "CPU time the decision writer's store calls spent preparing and writing batches",
            registry=r,
        )
        self._replayed_total = Counter(
            "switchboard_decisions_replayed",
            "Decisions from a spill file written to the store (at start or once it is back)",
            registry=r,
        )
        self._rejected_total = Counter(
            "switchboard_decisions_rejected",
            "Spill file lines that could not be replayed, set aside in <spill>.rejected",
            ["reason"],
            registry=r,
        )
        self._stalls_total = Counter(
            "switchboard_decision_store_stalls",
            "Store writes still in flight after the stall bound (a database that hangs "
            "rather than refuses); the writer spilled meanwhile",
            registry=r,
        )

    # ------------------------------------------------------------ the hot path
    def submit(self, row: Row) -> None:
        """Hot path: an append and a few additions, no lock, no I/O, no serialising.

        The size is ``row_bytes`` written out (a call costs as much as the sum). Past
        the memory budget the oldest decision is dropped here; that only happens when
        the writer could not move the excess to the spill file (it tries from nine
        tenths of the budget on)."""
        node, pod = row.node, row.pod
        size = _ROW_FIXED + len(row.id) + len(row.cluster)
        size += -64 if node is None else len(node) if node.isascii() else 4 * len(node) + 24
        size += -64 if pod is None else len(pod) if pod.isascii() else 4 * len(pod) + 24
        seen = self._shared_seen
        if row.shape_id not in seen or row.answer_id not in seen:
            size += self._count_shared(seen, row)
        self._in += size
        queue = self._queue
        if self._in > self._in_limit or (self._count_limited and len(queue) >= self._limit):
            self._drop_oldest(queue)
        queue.append(row)
        self._submitted += 1

    def _count_shared(self, seen: set[str], row: Row) -> int:
        """A shape or answer text not yet counted while buffered: its bytes, once."""
        added = 0
        for key, text in ((row.shape_id, row.shape_json), (row.answer_id, row.answer_json)):
            if key not in seen:
                seen.add(key)
                added += _shared_bytes(text)
        return added

    def _drop_oldest(self, queue: deque[Row]) -> None:
        """A few at most: a burst of new shapes must not empty the whole queue."""
        for _ in range(8):
            try:
                old = queue.popleft()
            except IndexError:  # the writer took them meanwhile
                return
            self._in -= row_bytes(old)
            self._hot_dropped += 1
            self._metrics.decisions_dropped.inc()
            if self._in <= self._in_limit and len(queue) < self._limit:
                return

    @property
    def pending(self) -> int:
        """Decisions in memory, not yet stored or spilled."""
        return len(self._queue) + len(self._inflight)

    @property
    def buffered_bytes(self) -> int:
        """The estimated memory the decisions in memory hold (``row_bytes``)."""
        return self._in - self._out

    @property
    def spill_pending(self) -> bool:
        """This replica spilled decisions that no drain has taken since."""
        return self._spill_gen > self._drained_gen

    def spill_bytes(self) -> int:
        return 0 if self._spill is None else self._spill.size()

    def _settled(self) -> int:
        return self._written + self._refused + self._spilled + self._dropped + self._hot_dropped

    def flush(self, timeout_s: float = 3.0, *, wake: bool = True) -> bool:
        """Wait until everything submitted before this call is in the store (or
        dropped): written from memory, or spilled and drained again.

        Readers call it first so that a listing shows the caller's own decisions.
        Returns False when the database could not take them in time. A waiter only
        wakes a healthy writer early: while the store is failing, retries keep to the
        backoff however many requests wait. ``wake=False`` waits for the writer's next
        batch (at most the flush interval) instead: a client looping on a read then
        costs no extra, smaller batches.
        """
        target = self._submitted
        deadline = time.monotonic() + timeout_s
        if wake:
            self._wake.set()
        with self._cond:
            while self._settled() < target or self.spill_pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    # ------------------------------------------------------------ start, stop
    def check_spill(self) -> str | None:
        """At start: can the spill file be written? The reason when not (logged with
        the path, and shown without it by ``/readyz``); the service answers anyway."""
        if self._spill is None:
            return self.spill_error
        self.spill_error = self._spill.probe()
        if self.spill_error is not None:
            self._spill_retry_at = time.monotonic() + SPILL_RETRY_S
            log.error(
                "the spill file %s cannot be written (%s): while the database is down, "
                "decisions stay in memory (SWITCHBOARD_BUFFER_LIMIT_MB) and the oldest "
                "are dropped past it; a crash then loses them all",
                self._spill.path,
                self.spill_error,
            )
        return self.spill_error

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="decision-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Flush what the store takes within ``shutdown_flush_s``; spill the rest."""
        self.flush(self._shutdown_flush_s)
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            # the step in flight ends within one stalled call (writing a refused batch
            # row by row can take longer): the rows it holds are its own until then
            self._thread.join(self._stall_ceiling + 1.0)
            if self._thread.is_alive():
                log.warning("waiting for the decision writer's step in flight to end")
                self._thread.join(self._shutdown_flush_s + 30.0)
        with self._take:
            leftover = [*self._inflight, *self._queue]
            self._queue.clear()
            self._inflight = []
        self._log_drops(force=True)
        self._spill_at_stop(leftover)
        if self._replay is not None:
            self._replay.close()  # the rest stays for the next start
            self._replay = None
        if self._spilled_undrained and self._spill is not None:
            log.error(
                "spilled %d decisions to %s: the store could not take them (%s); the next "
                "start with the same settings writes them to the store",
                self._spilled_undrained,
                self._spill.path,
                self.degraded or "flush timed out",
            )

    def _spill_at_stop(self, rows: list[Row]) -> None:
        i = 0
        while i < len(rows):
            chunk = rows[i : i + SPILL_CHUNK]
            done = self._append(chunk, retry_now=True)
            if done:
                self._settle(chunk[:done], spilled=done)
            i += done
            if done < len(chunk):
                break
        if i < len(rows):
            self._drop_at_stop(len(rows) - i)
        self._out = self._in  # nothing is left in memory

    def _drop_at_stop(self, n: int) -> None:
        self._dropped += n
        self._metrics.decisions_dropped.inc(n)
        if self._spill is None:
            why = "no spill path"
        else:
            why = f"the spill file {self._spill.path} could not take them: {self.spill_error}"
        log.error("dropped %d decisions at shutdown: the store could not take them and %s", n, why)
        self._drops_logged += n

    def replay_spill(self, budget_s: float = START_REPLAY_S) -> int:
        """At start, before serving: drain the spill files found into the store, for at
        most ``budget_s`` (a 512 MB file takes about a minute; a start must not); the
        writer goes on with the rest in the background. Safe to repeat (inserts skip
        known ids; a drain cut short leaves its file for the next one). Returns the
        number of decisions written.

        Never raises: whatever a spill file holds, a start that fails on it would fail
        again at every restart. Bad lines are set aside one by one (``spill.py``); an
        error nobody foresaw leaves the file where it is for the writer to retry."""
        before = self._replayed
        self._next_spill_check = 0.0
        try:
            self._drain(until=time.monotonic() + budget_s)
        except Exception:
            log.exception("replaying the spill file at start failed; the writer retries it")
            if self._replay is not None:
                self._replay.close()
                self._replay = None
            self._drain_blocked_until = time.monotonic() + SPILL_CHECK_S
        if self._replay is not None:
            log.warning(
                "replayed %d spilled decisions at start; the rest of %s follows in the "
                "background%s",
                self._replayed - before,
                self._replay.path,
                f" once the store answers ({self.degraded})" if self.degraded else "",
            )
        return self._replayed - before

    # ------------------------------------------------------------ the writer
    def _run(self) -> None:
        while not self._stopping.is_set():
            if self.degraded is None:
                self._wake.wait(self._interval)
            else:  # spill every interval; the store only at the backoff, never for a flush
                self._stopping.wait(self._interval)
            self._wake.clear()
            try:
                self._tick()
            except Exception:  # the writer must outlive a bug in one step
                if time.monotonic() - self._bug_logged_at > DROP_LOG_S:
                    self._bug_logged_at = time.monotonic()
                    log.exception("decision writer: unexpected error (retrying)")
            with self._cond:
                self._cond.notify_all()

    def _tick(self) -> None:
        self._collect_stalled()
        self._log_drops()
        if self.degraded is None:
            self._write_memory()
            self._drain()
            self._probe_spill()
        if self.degraded is not None:
            self._spill_memory()
            if time.monotonic() >= self._retry_at and not self._calls.busy:
                self._retry()

    def _retry(self) -> None:
        """One attempt on a failing store: a batch from memory, else the first batch of
        the spill file (read, not taken: the file stays where it is until the store
        answers); when it goes through, everything else follows at once."""
        if self._queue:
            self._write_memory(max_batches=1)
        elif self._spill is not None:
            rows = self._spill.peek(self._batch)
            if rows:
                self._write(rows, probe=True)  # written again by the drain: ids are skipped
            else:  # nothing a store must take (empty files, bad lines): no store needed
                self._drain(probe=True)
        if self.degraded is None:
            self._write_memory()
            self._drain()

    def _write(self, rows: Sequence[Row], *, probe: bool = False) -> int | None:
        """One batch into the store: how many of ``rows`` it stored (the rest it
        refused for their content and are set aside), or None when it is failing or
        hangs: it is marked degraded, and the next attempt waits for the backoff or for
        the hung call to end. ``probe``: rows the drain writes again, so a refusal of
        their content only says the store answers."""
        if self._calls.busy:  # a write that outlived its wait is still in flight
            return None
        self.attempts += 1
        call = self._calls.run(lambda: self._record(rows), self._stall_bound())
        if not call.done.is_set():
            self._stalled()
            return None
        error = call.error
        if error is None:
            self._recovered()
            return len(rows)
        if isinstance(error, CONTENT_REFUSALS):
            if probe:
                self._recovered()
                return 0
            return self._write_one_by_one(rows, error)
        self._failed(error)  # the database is down or refusing
        return None

    def _stall_bound(self) -> float:
        """How long the next write may be in flight before it counts as stalled.

        A hung database is told from a slow one by comparison: a store that is up but
        loaded (this replica at its maximum rate, the machine saturated) takes hundreds
        of ms a batch, and spilling around every such write would double the writer's
        work exactly when it is behind. So: ``STALL_FACTOR`` times the slowest of the
        recent writes, at least the floor (4 flush intervals) and at most
        ``MAX_STALL_S``, which bounds what a crash early in a hang can lose."""
        slowest = max(self._recent_writes, default=0.0)
        self._stall_s = min(max(self._stall_floor, STALL_FACTOR * slowest), self._stall_ceiling)
        return self._stall_s

    @property
    def _stall_ceiling(self) -> float:
        """The longest a store call may be in flight before it counts as stalled."""
        return max(MAX_STALL_S, self._stall_floor)

    def _record(self, rows: Sequence[Row]) -> None:
        """On the store's thread: the call itself, the CPU it takes there and, when it
        went through, how long it took (``_stall_bound``)."""
        cpu0, t0 = time.thread_time(), time.monotonic()
        try:
            self._db.record_rows(rows)
            self._recent_writes.append(time.monotonic() - t0)
        finally:
            self._writer_cpu.inc(time.thread_time() - cpu0)

    def _stalled(self) -> None:
        """A store write has been in flight ``stall_s``: the database hangs rather than
        refuses. Degraded, so the writer spills every interval, as for an outage."""
        self._stalls_total.inc()
        if self.degraded is None:
            self._degraded_since = time.monotonic()
            log.warning(
                "a decision store write has not answered for %.2f s (a database that "
                "hangs?): decisions go to the spill file every %.0f ms until it answers",
                self._stall_s,
                self._interval * 1000,
            )
        self.degraded = f"StoreStalled: a write has not answered for {self._stall_s:.2f} s"

    def _collect_stalled(self) -> None:
        """The outcome of a write that outlived its wait, once it has ended: an
        answer (committed, or refused for its content) means the store is back; an
        error is a failure like any other. Its rows were spilled meanwhile and are
        stored (again, harmlessly) from the spill file."""
        call: Call | None = self._calls.collect()
        if call is None:
            return
        if call.error is None or isinstance(call.error, CONTENT_REFUSALS):
            self._recovered()
        else:
            self._failed(call.error)

    def _failed(self, exc: BaseException) -> None:
        if self.degraded is None:
            self._degraded_since = time.monotonic()
            log.warning(
                "decision store unavailable (%s): decisions go to the spill file every "
                "%.0f ms until it is back",
                first_line(exc),
                self._interval * 1000,
            )
        self.degraded = f"{type(exc).__name__}: {first_line(exc)}"
        self._metrics.store_errors.labels(op="record_decisions").inc()
        self._backoff = min(max(self._backoff * 2, 0.1), MAX_BACKOFF_S)
        self._retry_at = time.monotonic() + self._backoff

    def _recovered(self) -> None:
        if self.degraded is not None:
            log.warning(
                "decision store back after %.1f s; writing buffered and spilled decisions",
                time.monotonic() - self._degraded_since,
            )
        self.degraded = None
        self._backoff = self._interval

    def _write_one_by_one(self, rows: Sequence[Row], exc: Exception) -> int | None:
        """The store refused a batch for its content, not for being down (a value no
        column takes): store the rows one by one and set aside those it refuses, so
        that one row it will never take cannot hold up every other, at every retry.
        Returns how many it stored (None: the store failed or hung part way; the
        caller tries the whole batch again later, known ids are skipped)."""
        log.error(
            "the store refused a batch of decisions (%s); writing them one by one", first_line(exc)
        )
        refused: list[tuple[Row, str]] = []
        for row in rows:
            call = self._calls.run(lambda row=row: self._record([row]), self._stall_bound())
            if not call.done.is_set():
                self._stalled()
                return None
            one = call.error
            if isinstance(one, CONTENT_REFUSALS):
                refused.append((row, f"the store refused it: {first_line(one)}"))
            elif one is not None:
                self._failed(one)
                return None
        stored = len(rows) - len(refused)
        if refused:
            self._rejected_total.labels(reason="store_refused").inc(len(refused))
            if self._spill is not None:
                self._spill.set_aside(refused)
                where = f"set aside in {self._spill.rejected_path}"
            else:
                where = "lost (no spill path)"
            log.error(
                "the store took %d of the batch's %d decisions; the %d it refused are %s",
                stored,
                len(rows),
                len(refused),
                where,
            )
        self._recovered()
        return stored

    def _write_memory(self, max_batches: int | None = None) -> None:
        done = 0
        while self._queue and not self._stopping.is_set():
            if max_batches is not None and done >= max_batches:
                return
            self._spill_excess()
            batch = self._take_batch(self._batch)
            if not batch:
                return
            stored = self._write(batch)
            if stored is None:
                self._put_back()
                return
            self._settle(batch, written=stored, refused=len(batch) - stored)
            done += 1

    def _take_batch(self, n: int) -> list[Row]:
        with self._take:
            batch: list[Row] = []
            queue = self._queue
            while queue and len(batch) < n:
                batch.append(queue.popleft())
            self._inflight = batch
        return batch

    def _put_back(self, rows: list[Row] | None = None) -> None:
        with self._take:
            self._queue.extendleft(reversed(self._inflight if rows is None else rows))
            self._inflight = []

    def _settle(
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
        self._in_limit = self._out + self._budget
        if written:
            self._metrics.decisions_written.inc(written)
        with self._cond:
            self._written += written
            self._refused += refused
            self._spilled += spilled
            self._cond.notify_all()

    # ------------------------------------------------------------ spilling
    def _probe_spill(self) -> None:
        """A spill file that could not be written is looked at again now and then, so
        that ``/readyz`` clears once the volume is fixed, not only at the next outage."""
        if self._spill is None or self._spill_off or self.spill_error is None:
            return
        if time.monotonic() < self._spill_retry_at:
            return
        error = self._spill.probe()
        if error is None:
            log.warning("the spill file %s can be written again", self._spill.path)
        self.spill_error = error
        self._spill_retry_at = time.monotonic() + SPILL_CHECK_S

    def _spill_memory(self) -> None:
        """The store is failing: everything in memory goes to the spill file, so that a
        crash now loses at most one interval. In chunks of a flush batch: rows out of the
        queue are out of the hot path's reach, which drops the oldest it can see when
        memory is at its budget, so a smaller chunk keeps that order closer; but at least
        ``SPILL_MIN_CHUNK``, since every chunk is one locked, fsynced append."""
        while self._queue and not self._stopping.is_set():
            if not self._spill_chunk(min(SPILL_CHUNK, max(self._batch, SPILL_MIN_CHUNK))):
                return

    def _spill_excess(self) -> None:
        """The store is up but slower than the decisions come: past nine tenths of the
        memory budget, the oldest go to the spill file (drained once the store keeps up)."""
        if self.buffered_bytes <= self._budget * 0.9:
            return
        while self._queue and self.buffered_bytes > self._budget * 0.75:
            if not self._spill_chunk(self._batch):
                return

    def _spill_chunk(self, n: int) -> bool:
        """Move up to ``n`` of the oldest rows to the spill file; False when it took
        not all of them (the rest stay in memory, first in line)."""
        if self._spill is None or self._spill_off:
            return False
        if self.spill_error is not None and time.monotonic() < self._spill_retry_at:
            return False
        chunk = self._take_batch(n)
        done = self._append(chunk)
        if done < len(chunk):
            self._put_back(chunk[done:])
        if done:
            self._settle(chunk[:done], spilled=done)
        return done == len(chunk) and done > 0

    def _append(self, rows: Sequence[Row], *, retry_now: bool = False) -> int:
        """Append to the spill file; count it, and keep ``spill_error`` current."""
        if self._spill is None or self._spill_off or not rows:
            return 0
        if not retry_now and self.spill_error and time.monotonic() < self._spill_retry_at:
            return 0
        result = self._spill.append(rows)
        if result.count:
            self._spill_gen += 1
            self._spilled_undrained += result.count
            self._spilled_total.inc(result.count)
        if result.error is None:
            if self.spill_error is not None and not self.spill_error.startswith("off"):
                log.warning("the spill file %s takes decisions again", self._spill.path)
            self.spill_error = None
        else:
            if result.error != self.spill_error:
                log.error(
                    "the spill file %s took %d of %d decisions: %s; the rest stay in memory "
                    "(SWITCHBOARD_BUFFER_LIMIT_MB), retried every %.0f s",
                    self._spill.path,
                    result.count,
                    len(rows),
                    result.error,
                    SPILL_RETRY_S,
                )
            self.spill_error = result.error
            self._spill_retry_at = time.monotonic() + SPILL_RETRY_S
        return result.count

    # ------------------------------------------------------------ draining
    def _spill_work_due(self, *, force: bool = False) -> bool:
        if self._spill is None:
            return False
        now = time.monotonic()
        if now < self._drain_blocked_until:
            return False
        if self._replay is not None or self.spill_pending:
            return True
        if not force and now < self._next_spill_check:
            return False
        self._next_spill_check = now + SPILL_CHECK_S
        return self._spill.has_work()

    def _drain(self, *, probe: bool = False, until: float | None = None) -> None:
        """Spilled decisions (this replica's or another's on the same path) into the
        store, a batch at a time, with this replica's new decisions between batches so a
        long drain does not hold them up. ``probe``: files with nothing for the store
        (empty, or bad lines only) are taken even while it is failing."""
        if self._spill is None or (self._replay is None and not self._spill_work_due(force=probe)):
            return
        while not self._stopping.is_set() and (self.degraded is None or probe):
            if until is not None and time.monotonic() >= until:
                return
            try:
                if self._replay is None:
                    gen = self._spill_gen
                    self._replay = self._spill.claim()
                    if self._replay is None:  # every append so far is in a file taken
                        self._mark_drained(gen)
                        return
                replay = self._replay
                rows = replay.read(self._batch)
            except OSError as exc:
                self._drain_failed(exc)
                return
            self._count_rejected(replay)
            if rows:
                stored = self._write(rows)
                if stored is None:
                    replay.rewind()  # read again once the store is back
                    return
                replay.commit(stored, refused=len(rows) - stored)
                self._replayed += stored
                self._replayed_total.inc(stored)
            if replay.eof:
                self._replay = None
                self._finish_replay(replay)
            if not probe:
                self._write_memory()

    def _drain_failed(self, exc: OSError) -> None:
        """A spill file that cannot be read (permissions, an I/O error): left where it
        is for a later try or another replica, logged once per kind of error."""
        if self._replay is not None:
            self._replay.close()
            self._replay = None
        self._drain_blocked_until = time.monotonic() + SPILL_CHECK_S
        reason = f"{type(exc).__name__}: {exc}"
        if reason != self._drain_error:
            log.error(
                "cannot drain the spill file (retried every %.0f s): %s", SPILL_CHECK_S, reason
            )
        self._drain_error = reason

    def _finish_replay(self, replay: Replay) -> None:
        self._drain_error = None
        replay.finish()
        rejected = replay.rejected_total + replay.refused
        assert self._spill is not None
        if rejected:
            refused = f", {replay.refused} refused by the store" if replay.refused else ""
            kept = (
                f" ({replay.not_kept} of them only counted: the file is at its size limit)"
                if replay.not_kept
                else ""
            )
            log.error(
                "replayed %d spilled decisions from %s into the store; %d lines could not "
                "be replayed (%d of them a partial last line%s) and are in %s with the "
                "reason%s",
                replay.stored,
                replay.path,
                rejected,
                replay.partial,
                refused,
                self._spill.rejected_path,
                kept,
            )
        else:
            log.warning(
                "replayed %d spilled decisions from %s into the store", replay.stored, replay.path
            )

    def _mark_drained(self, gen: int) -> None:
        with self._cond:
            if gen > self._drained_gen:
                self._drained_gen = gen
                self._spilled_undrained = 0
            self._cond.notify_all()

    def _count_rejected(self, replay: Replay) -> None:
        for kind, n in replay.take_rejected().items():
            self._rejected_total.labels(reason=kind).inc(n)

    # ------------------------------------------------------------ drops
    def _log_drops(self, *, force: bool = False) -> None:
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
            self._budget / MIB,
            self.spill_error or "the writer fell behind",
            dropped,
        )
