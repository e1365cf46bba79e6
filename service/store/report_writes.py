"""Measurement reports stored in groups: one transaction and one commit for every report
waiting (group commit, as the decision log's drainer stores decisions).

In a boot storm thousands of pods report at once. Stored one transaction each, a
report cost a duplicate check, an insert and a commit of its own (each a round trip
to the database), a second transaction to move ``evidence_version``, and two thread
hand-offs (the route's worker, then the store call's). Here a request hands its
report to the one writer thread and waits for its ticket; the writer takes every
report queued (up to ``batch``) and stores them with ``store_reports``: one duplicate
check, one insert, one bump, one commit. A request waits at most ``deadline_s`` (the
request's store deadline, ``store/deadline.py``), and what a 503 then says holds: a
report whose wait ended before its batch committed is left out of it (the batch is
rolled back and stored again without it), one whose commit was sent may or may not
be stored (an agent's retry with the same ``report_id`` is answered as a duplicate).

The writer keeps its connection between batches (a checkout pings the database, a
round trip per batch); a batch refused on it is tried once more on a new one. A batch
the database refuses before its commit is then tried again one report at a time, so
one report that cannot be stored fails alone; a refused commit fails its batch.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from mla_switchboard.core.evidence import Observation
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.store.deadline import StoreTimeout, write_timeout
from mla_switchboard.service.store.measurements import PendingReport, StoredReport, store_reports
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("switchboard.store")

BATCH = 128
"""The most reports one transaction stores."""


class _State(enum.Enum):
    QUEUED = "queued"
    TAKEN = "taken"  # in a transaction not yet committing
    COMMITTING = "committing"  # its commit was sent
    ABANDONED = "abandoned"  # its request stopped waiting before the commit
    DONE = "done"


@dataclass(eq=False)
class ReportTicket:
    """One report handed to the writer: ``wait`` for what was stored, or have
    ``on_done`` called (on the writer's thread) once it is known."""

    pending: PendingReport
    _writer: ReportWriter
    _done: threading.Event = field(default_factory=threading.Event)
    _state: _State = _State.QUEUED
    _result: StoredReport | None = None
    _error: BaseException | None = None
    _callbacks: list[Callable[[], None]] = field(default_factory=list)

    def wait(self, timeout_s: float | None) -> StoredReport | None:
        """What ``store_reports`` answered for it; ``StoreTimeout`` past ``timeout_s``
        (None: no limit), the store's error when it could not be stored."""
        if not self._done.wait(timeout_s):
            self.give_up(timeout_s or 0.0)
        return self.outcome()

    def outcome(self) -> StoredReport | None:
        """The answer of a ticket that is done (``on_done`` called, or ``wait``
        returned): the stored report, or the error raised."""
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the ticket is done (at once when it is)."""
        with self._writer._cond:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def give_up(self, waited_s: float) -> None:
        """The request stops waiting: left out of any batch not yet committing, and
        ``StoreTimeout`` raised saying so (or saying the outcome is unknown when its
        commit was sent). Returns when the ticket ended meanwhile."""
        with self._writer._cond:
            state = self._state
            if state in (_State.QUEUED, _State.TAKEN):
                self._state = _State.ABANDONED
        if state is _State.DONE:
            return
        raise write_timeout(
            waited_s, started=state is not _State.QUEUED, committing=state is _State.COMMITTING
        )

    def _finish(self, result: StoredReport | None, error: BaseException | None) -> None:
        with self._writer._cond:
            self._result, self._error = result, error
            if self._state is not _State.ABANDONED:
                self._state = _State.DONE
            callbacks, self._callbacks = self._callbacks, []
            self._done.set()
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a waiter gone (its loop closed): the others are answered
                log.exception("a report's waiter could not be woken")


class _Abandoned(Exception):
    """A report of the batch stopped waiting before the commit: roll back, go again."""


class ReportWriter:
    """The one thread that stores this replica's measurement reports, in groups.
    ``on_stored``: given the evidence of every counted report of a batch once it is
    committed, before any of them is answered (this replica applies its own evidence
    at once). ``inline``: store in the caller's thread (an in-memory SQLite database,
    whose one connection lives on the thread that opened it)."""

    def __init__(
        self,
        engine: Engine,
        on_stored: Callable[[list[Observation]], object] | None = None,
        *,
        batch: int = BATCH,
        inline: bool = False,
    ) -> None:
        self.engine = engine
        self.on_stored = on_stored
        self.batch = batch
        self.inline = inline
        self._cond = threading.Condition()
        self._inline = threading.Lock()
        self._queue: deque[ReportTicket] = deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        # kept between batches (the writer's thread alone uses it): a checkout would
        # cost a ping, a round trip, per batch
        self._conn: Connection | None = None
        self.batches = 0  # transactions committed (the tests count them)

    def submit(self, pending: PendingReport) -> ReportTicket:
        """Queue ``pending`` for the next batch (started on first use)."""
        ticket = ReportTicket(pending, self)
        if self.inline:
            ticket._state = _State.TAKEN
            with self._inline:
                self._write([ticket])
                self._close()
            return ticket
        with self._cond:
            if self._stopping:
                raise StoreTimeout(
                    "the service is stopping: the report was not stored; retry",
                    outcome_unknown=False,
                    retry_after_s=1,
                )
            self._queue.append(ticket)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="report-writer", daemon=True)
                self._thread.start()
            self._cond.notify()
        return ticket

    def store(self, pending: PendingReport, timeout_s: float | None) -> StoredReport | None:
        """``submit`` and wait at most ``timeout_s`` for the answer."""
        return self.submit(pending).wait(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Store what is queued, then end the thread."""
        with self._cond:
            self._stopping = True
            thread = self._thread
            self._cond.notify()
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    self._close()
                    return
                taken: list[ReportTicket] = []
                while self._queue and len(taken) < self.batch:
                    ticket = self._queue.popleft()
                    if ticket._state is _State.QUEUED:
                        ticket._state = _State.TAKEN
                        taken.append(ticket)
            if taken:
                self._write(taken)

    def _write(self, tickets: list[ReportTicket]) -> None:
        while tickets:
            kept = self._conn is not None
            try:
                results = self._transaction(tickets)
            except _Abandoned:
                with self._cond:
                    tickets = [t for t in tickets if t._state is _State.TAKEN]
                continue
            except SQLAlchemyError as exc:
                self._close()
                with self._cond:  # a report given up meanwhile is no longer answered
                    tickets = [t for t in tickets if t._state is not _State.ABANDONED]
                    before_commit = all(t._state is _State.TAKEN for t in tickets)
                if kept and before_commit:
                    continue  # the kept connection may have died idle: once on a new one
                self._refused(tickets, exc, before_commit=before_commit)
                return
            except Exception as exc:  # a bug: each waiter is answered, the thread goes on
                log.exception("a batch of %d reports failed", len(tickets))
                for t in tickets:
                    t._finish(None, exc)
                return
            self.batches += 1
            self._apply(tickets, results)
            for t, result in zip(tickets, results, strict=True):
                t._finish(result, None)
            return

    def _transaction(self, tickets: list[ReportTicket]) -> list[StoredReport | None]:
        if self._conn is None:
            self._conn = self.engine.connect()
        with self._conn.begin():
            results = store_reports(self._conn, [t.pending for t in tickets])
            with self._cond:
                if any(t._state is not _State.TAKEN for t in tickets):
                    raise _Abandoned
                for t in tickets:
                    t._state = _State.COMMITTING
        return results

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except SQLAlchemyError as exc:
                log.debug("report writer's connection not closed cleanly: %s", exc)

    def _refused(
        self, tickets: list[ReportTicket], exc: SQLAlchemyError, *, before_commit: bool
    ) -> None:
        """A batch the database refused: before its commit and of several reports,
        each is tried again alone (one bad report fails alone); else each fails."""
        if before_commit and len(tickets) > 1:
            log.warning(
                "a batch of %d reports was refused (%s): stored one at a time",
                len(tickets),
                first_line(exc),
            )
            for t in tickets:
                with self._cond:
                    alive = t._state is _State.TAKEN
                if alive:
                    self._write([t])
            return
        for t in tickets:
            t._finish(None, exc)

    def _apply(self, tickets: list[ReportTicket], results: list[StoredReport | None]) -> None:
        if self.on_stored is None:
            return
        fresh = [
            o
            for t, stored in zip(tickets, results, strict=True)
            if stored is not None and stored.counted
            for o in t.pending.observations
        ]
        if not fresh:
            return
        try:
            self.on_stored(fresh)
        except Exception:  # the reports are stored: the evidence sync reads them anyway
            log.exception("stored reports not applied in memory: the next sync reads them")
