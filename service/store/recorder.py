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
  flight longer than writes have been taking (``RetryPolicy.stall_bound``: at least 4
  intervals, 200 ms) the writer spills what is in memory, the batch in flight
  included, and goes on spilling every interval until that call ends.
  If it then commits, the same decisions are written again from the spill file, which
  is harmless: inserts skip known ids.

Every spill, replay, rejected line and drop is counted
(``switchboard_decisions_{spilled,replayed,rejected,dropped}_total``) and logged with
its count, never once per decision. The counts are exact: a decision is counted
written or replayed only once the store took it, and a row the store refuses only as
rejected.

The hot path hands over one named tuple per decision (``Row``: ``rows.Decision``, as
small as a plain tuple) and adds up its size; serialising and SQL happen on the writer
thread, in batches. This class runs that
thread and composes the parts in ``recording/``: the memory queue, the store writer,
the spill log and its drain.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.decisions import DecisionStore
from mla_switchboard.service.store.recording.journal import Journal
from mla_switchboard.service.store.recording.memory_queue import DROP_LOG_S, MIB, MemoryQueue
from mla_switchboard.service.store.recording.spill_drain import SpillDrain
from mla_switchboard.service.store.recording.spill_log import SpillLog
from mla_switchboard.service.store.recording.writer import RetryPolicy, StoreWriter
from mla_switchboard.service.store.rows import Decision as Row
from mla_switchboard.service.store.spill import REJECTED_LIMIT_BYTES, SpillFile

log = logging.getLogger("switchboard.recorder")

DEFAULT_BUDGET_BYTES = 128 * MIB
DEFAULT_SPILL_LIMIT_BYTES = 512 * MIB
SPILL_CHUNK = 5000  # rows encoded and appended at once (bounds the writer's own memory)
SPILL_MIN_CHUNK = 500  # ... and at least this many, whatever the flush batch: one fsync each
START_REPLAY_S = 10.0  # how long a start replays spill files before it serves


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
        spill_path: Path | None = None,
        spill_limit_bytes: int = DEFAULT_SPILL_LIMIT_BYTES,
        shutdown_flush_s: float = 5.0,
        stall_s: float | None = None,
        rejected_limit_bytes: int = REJECTED_LIMIT_BYTES,
        journal: bool = True,
    ) -> None:
        """``stall_s``: the least time a store write may be in flight before the
        writer spills what is in memory and counts the store as degraded (by default
        ``STALL_INTERVALS`` flush intervals, at least ``MIN_STALL_S``); see
        ``RetryPolicy.stall_bound``.
        ``rejected_limit_bytes``: the most ``<spill>.rejected`` grows to.
        ``journal``: every decision also goes to the journal (``recording/journal.py``)
        beside the spill file, on disk within a few ms whatever the store does; off
        without a spill path or with the spill file off (nothing would drain it)."""
        self._interval = interval_s
        self._batch = batch
        self.spill_path = spill_path
        self._shutdown_flush_s = shutdown_flush_s
        self._progress = threading.Condition()  # decisions settled or drained: flush waits
        self._memory = MemoryQueue(metrics, self._progress, budget_bytes=budget_bytes, limit=limit)
        file = (
            SpillFile(spill_path, spill_limit_bytes, rejected_limit_bytes) if spill_path else None
        )
        self._spill = SpillLog(file, metrics, self._progress)
        self._journal = (
            Journal(spill_path, metrics, self._memory.settled_prefix)
            if journal and spill_path is not None and spill_limit_bytes > 0
            else None
        )
        self._journal_submit = None if self._journal is None else self._journal.submit
        if file is not None and self._journal is not None:
            file.not_backlog = self._journal.own
        self._drain = SpillDrain(self._spill, metrics, batch=batch)
        self._writer = StoreWriter(store, metrics, RetryPolicy(interval_s, stall_s), self._spill)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._bug_logged_at = 0.0

    # ------------------------------------------------------------ the public state
    def submit(self, row: Row) -> bool:
        """Hot path: an append and a few additions (``MemoryQueue.submit``), and an
        append to the journal's deque, in the same order. False: not kept (memory at
        its budget, the spill file unable to take the excess): the answer says so."""
        if not self._memory.submit(row):
            return False
        journal = self._journal_submit
        if journal is not None:
            journal(row)
        return True

    @property
    def pending(self) -> int:
        """Decisions in memory, not yet stored or spilled."""
        return self._memory.pending

    @property
    def buffered_bytes(self) -> int:
        """The estimated memory the decisions in memory hold (``row_bytes``)."""
        return self._memory.buffered_bytes

    @property
    def spill_pending(self) -> bool:
        """This replica spilled decisions that no drain has taken since."""
        return self._spill.pending

    @property
    def spill_error(self) -> str | None:
        """Why the spill file cannot take decisions now; None when it can."""
        return self._spill.error

    @property
    def degraded(self) -> str | None:
        """Why store writes are failing; None when the store is up."""
        return self._writer.degraded

    @property
    def attempts(self) -> int:
        """Store writes tried (the backoff test counts them)."""
        return self._writer.attempts

    def spill_bytes(self) -> int:
        """Bytes of spilled decisions waiting for the store, drains in progress
        included (their files are renamed away from the spill path)."""
        return self._spill.size()

    def spill_backlog(self) -> str | None:
        """What ``/readyz`` says while spilled decisions wait for the store, e.g.
        ``draining 60,000 spilled decisions, 31% done``; None when none wait."""
        waiting, lines, done = self._drain.progress()
        if not waiting:
            return None
        verb = "draining" if self._writer.up else "holding"
        return f"{verb} {lines:,} spilled decisions, {int(done * 100)}% done"

    def flush(self, timeout_s: float = 3.0, *, wake: bool = True, reader: bool = False) -> bool:
        """Wait until everything submitted before this call is in the store (or
        dropped): written from memory, or spilled and drained again.

        Readers call it first so that a listing shows the caller's own decisions.
        Returns False when the database could not take them in time. A waiter only
        wakes a healthy writer early: while the store is failing, retries keep to the
        backoff however many requests wait. ``wake=False`` waits for the writer's next
        batch (at most the flush interval) instead: a client looping on a read then
        costs no extra, smaller batches. ``reader=True``: a request about to read,
        which gives up at once while the store is failing or stalled.
        """
        target = self._memory.submitted
        if reader and self._writer.degraded and self._memory.settled() < target:
            # the store is failing or stalled: waiting cannot get them written, and a
            # reader held here adds seconds to an answer that a frozen store already
            # delays (its own calls are bounded by SWITCHBOARD_STORE_DEADLINE_S)
            return False
        deadline = time.monotonic() + timeout_s
        if wake:
            self._wake.set()
        with self._progress:
            while self._memory.settled() < target or self._spill.pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._progress.wait(remaining)
        return True

    # ------------------------------------------------------------ start, stop
    def check_spill(self) -> str | None:
        """At start: can the spill file be written? The reason when not (logged with
        the path, and shown without it by ``/readyz``); the service answers anyway."""
        return self._spill.check()

    @property
    def journal_error(self) -> str | None:
        """Why the journal cannot write now; None when it can (or is off)."""
        return None if self._journal is None else self._journal.error

    def start(self) -> None:
        if self._journal is not None:
            self._journal.start()
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
            self._thread.join(self._writer.policy.stall_ceiling + 1.0)
            if self._thread.is_alive():
                log.warning("waiting for the decision writer's step in flight to end")
                self._thread.join(self._shutdown_flush_s + 30.0)
        if self._journal is not None:
            self._journal.hold()  # what leaves memory below is not yet spilled
        leftover = self._memory.take_all()
        self._memory.log_drops(self._spill.error, force=True)
        self._spill_at_stop(leftover)
        self._drain.close()  # the rest stays for the next start
        if self._journal is not None:
            self._journal.stop()
        if self._spill.undrained and self._spill.path is not None:
            log.error(
                "spilled %d decisions to %s: the store could not take them (%s); the next "
                "start with the same settings writes them to the store",
                self._spill.undrained,
                self._spill.path,
                self._writer.degraded or "flush timed out",
            )

    def _spill_at_stop(self, rows: list[Row]) -> None:
        i = 0
        while i < len(rows):
            chunk = rows[i : i + SPILL_CHUNK]
            done = self._spill.append(chunk, retry_now=True)
            if done:
                self._memory.settle(chunk[:done], spilled=done)
            i += done
            if done < len(chunk):
                break
        if i < len(rows):
            if self._spill.path is None:
                why = "no spill path"
            else:
                why = f"the spill file {self._spill.path} could not take them: {self._spill.error}"
            self._memory.drop(len(rows) - i, why)
        self._memory.forget_all()

    def replay_spill(self, budget_s: float = START_REPLAY_S) -> int:
        """At start, before serving: drain the spill files found into the store, for at
        most ``budget_s`` (a 512 MB file takes about a minute; a start must not); the
        writer goes on with the rest in the background. Safe to repeat (inserts skip
        known ids; a drain cut short leaves its file for the next one). Returns the
        number of decisions written.

        Never raises: whatever a spill file holds, a start that fails on it would fail
        again at every restart. Bad lines are set aside one by one (``spill.py``); an
        error nobody foresaw leaves the file where it is for the writer to retry."""
        before = self._drain.replayed
        self._drain.look_now()
        try:
            self._drain_spill(until=time.monotonic() + budget_s)
        except Exception:
            log.exception("replaying the spill file at start failed; the writer retries it")
            self._drain.give_up()
        unfinished = self._drain.unfinished
        if unfinished is not None:
            degraded = self._writer.degraded
            log.warning(
                "replayed %d spilled decisions at start; the rest of %s follows in the "
                "background%s",
                self._drain.replayed - before,
                unfinished,
                f" once the store answers ({degraded})" if degraded else "",
            )
        return self._drain.replayed - before

    # ------------------------------------------------------------ the writer thread
    def _run(self) -> None:
        while not self._stopping.is_set():
            if self._writer.up:
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
            with self._progress:
                self._progress.notify_all()

    def _tick(self) -> None:
        self._writer.collect_stalled()
        self._memory.log_drops(self._spill.error)
        if self._writer.up:
            self._write_memory()
            self._drain_spill()
            self._spill.probe_again()
        if not self._writer.up:
            self._spill_memory()
            if self._writer.retry_due():
                self._retry()

    def _retry(self) -> None:
        """One attempt on a failing store: a batch from memory, else the first batch of
        the spill file (read, not taken: the file stays where it is until the store
        answers); when it goes through, everything else follows at once."""
        file = self._spill.file
        if self._memory.queued:
            self._write_memory(max_batches=1)
        elif file is not None:
            rows = file.peek(self._batch)
            if rows:
                # written again by the drain: ids are skipped
                self._writer.write(rows, probe=True)
            else:  # nothing a store must take (empty files, bad lines): no store needed
                self._drain_spill(probe=True)
        if self._writer.up:
            self._write_memory()
            self._drain_spill()

    def _drain_spill(self, *, probe: bool = False, until: float | None = None) -> None:
        """Spilled decisions into the store, with new decisions between batches
        (``SpillDrain.drain``); only while the store is up, unless ``probe``."""
        self._drain.drain(
            self._writer.write,
            self._write_memory,
            going=lambda: not self._stopping.is_set() and (probe or self._writer.up),
            probe=probe,
            until=until,
        )

    def _write_memory(self, max_batches: int | None = None) -> None:
        done = 0
        while self._memory.queued and not self._stopping.is_set():
            if max_batches is not None and done >= max_batches:
                return
            self._spill_excess()
            batch = self._memory.take_batch(self._batch)
            if not batch:
                return
            stored = self._writer.write(batch)
            if stored is None:
                self._memory.put_back()
                return
            self._memory.settle(batch, written=stored, refused=len(batch) - stored)
            done += 1

    # ------------------------------------------------------------ memory to the spill file
    def _spill_memory(self) -> None:
        """The store is failing: everything in memory goes to the spill file, so that a
        crash now loses at most one interval. In chunks of a flush batch: rows out of the
        queue are out of the hot path's reach, which drops the oldest it can see when
        memory is at its budget, so a smaller chunk keeps that order closer; but at least
        ``SPILL_MIN_CHUNK``, since every chunk is one locked, fsynced append."""
        while self._memory.queued and not self._stopping.is_set():
            if not self._spill_chunk(min(SPILL_CHUNK, max(self._batch, SPILL_MIN_CHUNK))):
                return

    def _spill_excess(self) -> None:
        """The store is up but slower than the decisions come: past nine tenths of the
        memory budget, the oldest go to the spill file (drained once the store keeps up)."""
        if not self._memory.over_share(0.9):
            return
        while self._memory.queued and self._memory.over_share(0.75):
            if not self._spill_chunk(self._batch):
                return

    def _spill_chunk(self, n: int) -> bool:
        """Move up to ``n`` of the oldest rows to the spill file; False when it took
        not all of them (the rest stay in memory, first in line)."""
        if not self._spill.can_take():
            return False
        chunk = self._memory.take_batch(n)
        done = self._spill.append(chunk)
        if done < len(chunk):
            self._memory.put_back(chunk[done:])
        if done:
            self._memory.settle(chunk[:done], spilled=done)
        return done == len(chunk) and done > 0
