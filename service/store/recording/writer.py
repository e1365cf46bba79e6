"""Batches into the store, and what the store's answers say about it.

The store is in one of three states (``StoreState``): up; down (a write failed:
retried with backoff, 100 ms doubling to 2 s, however many readers wait for a flush);
or stalled (a write has been in flight past the stall bound: a database that hangs
rather than refuses). Down or stalled, the recorder spills every interval.

A store call runs on a thread of its own (``call_thread.py``) and is waited for only
as long as ``RetryPolicy.stall_bound`` allows. A batch the store refuses for its
content (not for being down) is written row by row; the rows it refuses are set aside
(``SpillLog.set_aside``), so one row it will never take cannot hold up every other.

Counted: ``switchboard_decision_store_stalls_total`` and the CPU the store calls take
(``switchboard_decision_writer_cpu_seconds_total``); failures as
``switchboard_store_errors_total{op="record_decisions"}``.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import deque
from collections.abc import Sequence

import psycopg
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.call_thread import Call, CallThread
from mla_switchboard.service.store.recording.spill_log import SpillLog
from mla_switchboard.service.store.rows import Decision as Row
from prometheus_client import Counter
from sqlalchemy.exc import DataError, IntegrityError

log = logging.getLogger("switchboard.recorder")

CONTENT_REFUSALS = (DataError, IntegrityError, psycopg.DataError, psycopg.IntegrityError)
"""The store refusing a batch for what it holds, not for being down. SQLAlchemy wraps
the driver's errors for the statements it runs; the PostgreSQL batch's ``COPY`` and
its statements go to psycopg directly, whose errors arrive unwrapped."""
MAX_BACKOFF_S = 2.0
STALL_INTERVALS = 4  # a store write in flight this many flush intervals counts as stalled,
MIN_STALL_S = 0.2  # ... and at least this long,
STALL_FACTOR = 3  # ... or this many times the slowest of the last RECENT_WRITES writes,
RECENT_WRITES = 64
MAX_STALL_S = 2.0  # ... but never longer than this


class StoreState(enum.Enum):
    UP = "up"
    DOWN = "down"  # writes fail: retried at the backoff
    STALLED = "stalled"  # a write outlived the stall bound: waited for, then collected


class RetryPolicy:
    """When to try a failing store again, and how long a write may take.

    ``stall_s``: the least time a store write may be in flight before it counts as
    stalled (by default ``STALL_INTERVALS`` flush intervals, at least ``MIN_STALL_S``)."""

    def __init__(self, interval_s: float, stall_s: float | None = None) -> None:
        self.interval_s = interval_s
        self.stall_floor = (
            stall_s if stall_s is not None else max(STALL_INTERVALS * interval_s, MIN_STALL_S)
        )
        self.stall_s = self.stall_floor  # the bound the last write was given
        self._recent_writes: deque[float] = deque(maxlen=RECENT_WRITES)  # seconds each
        self.backoff_s = interval_s
        self._retry_at = 0.0

    def failed(self) -> None:
        """A write failed: the next waits twice as long as the last (100 ms to 2 s)."""
        self.backoff_s = min(max(self.backoff_s * 2, 0.1), MAX_BACKOFF_S)
        self._retry_at = time.monotonic() + self.backoff_s

    def recovered(self) -> None:
        self.backoff_s = self.interval_s

    def retry_due(self) -> bool:
        return time.monotonic() >= self._retry_at

    def took(self, seconds: float) -> None:
        """A write that went through, and how long it took (``stall_bound``)."""
        self._recent_writes.append(seconds)

    def stall_bound(self) -> float:
        """How long the next write may be in flight before it counts as stalled.

        A hung database is told from a slow one by comparison: a store that is up but
        loaded (this replica at its maximum rate, the machine saturated) takes hundreds
        of ms a batch, and spilling around every such write would double the writer's
        work exactly when it is behind. So: ``STALL_FACTOR`` times the slowest of the
        recent writes, at least the floor (4 flush intervals) and at most
        ``MAX_STALL_S``, which bounds what a crash early in a hang can lose."""
        slowest = max(self._recent_writes, default=0.0)
        self.stall_s = min(max(self.stall_floor, STALL_FACTOR * slowest), self.stall_ceiling)
        return self.stall_s

    @property
    def stall_ceiling(self) -> float:
        """The longest a store call may be in flight before it counts as stalled."""
        return max(MAX_STALL_S, self.stall_floor)


class StoreWriter:
    def __init__(
        self, store: Store, metrics: Metrics, policy: RetryPolicy, spill: SpillLog
    ) -> None:
        self._db = store
        self._metrics = metrics
        self.policy = policy
        self._spill = spill
        self._calls = CallThread("decision-store")
        self.state = StoreState.UP
        self.degraded: str | None = None  # why writes are failing, None when up
        self._degraded_since = 0.0
        self.attempts = 0  # store writes tried (the backoff test counts them)
        r = metrics.registry
        self._writer_cpu = Counter(
            "switchboard_decision_writer_cpu_seconds",
            "CPU time the decision writer's store calls spent preparing and writing batches",
            registry=r,
        )
        self._stalls_total = Counter(
            "switchboard_decision_store_stalls",
            "Store writes still in flight after the stall bound (a database that hangs "
            "rather than refuses); the writer spilled meanwhile",
            registry=r,
        )

    @property
    def up(self) -> bool:
        return self.state is StoreState.UP

    def retry_due(self) -> bool:
        """A failing store may be tried again: the backoff is over, no call in flight."""
        return self.policy.retry_due() and not self._calls.busy

    def write(self, rows: Sequence[Row], *, probe: bool = False) -> int | None:
        """One batch into the store: how many of ``rows`` it stored (the rest it
        refused for their content and are set aside), or None when it is failing or
        hangs: it is marked down or stalled, and the next attempt waits for the backoff
        or for the hung call to end. ``probe``: rows the drain writes again, so a
        refusal of their content only says the store answers."""
        if self._calls.busy:  # a write that outlived its wait is still in flight
            return None
        self.attempts += 1
        call = self._calls.run(lambda: self._record(rows), self.policy.stall_bound())
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

    def collect_stalled(self) -> None:
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

    def _record(self, rows: Sequence[Row]) -> None:
        """On the store's thread: the call itself, the CPU it takes there and, when it
        went through, how long it took (``RetryPolicy.stall_bound``)."""
        cpu0, t0 = time.thread_time(), time.monotonic()
        try:
            self._db.record_rows(rows)
            self.policy.took(time.monotonic() - t0)
        finally:
            self._writer_cpu.inc(time.thread_time() - cpu0)

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
            call = self._calls.run(lambda row=row: self._record([row]), self.policy.stall_bound())
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
            log.error(
                "the store took %d of the batch's %d decisions; the %d it refused are %s",
                stored,
                len(rows),
                len(refused),
                self._spill.set_aside(refused),
            )
        self._recovered()
        return stored

    def _stalled(self) -> None:
        """A store write has been in flight ``stall_s``: the database hangs rather than
        refuses. Stalled, so the recorder spills every interval, as for an outage."""
        self._stalls_total.inc()
        if self.degraded is None:
            self._degraded_since = time.monotonic()
            log.warning(
                "a decision store write has not answered for %.2f s (a database that "
                "hangs?): decisions go to the spill file every %.0f ms until it answers",
                self.policy.stall_s,
                self.policy.interval_s * 1000,
            )
        self.state = StoreState.STALLED
        self.degraded = f"StoreStalled: a write has not answered for {self.policy.stall_s:.2f} s"

    def _failed(self, exc: BaseException) -> None:
        if self.degraded is None:
            self._degraded_since = time.monotonic()
            log.warning(
                "decision store unavailable (%s): decisions go to the spill file every "
                "%.0f ms until it is back",
                first_line(exc),
                self.policy.interval_s * 1000,
            )
        self.state = StoreState.DOWN
        self.degraded = f"{type(exc).__name__}: {first_line(exc)}"
        self._metrics.store_errors.labels(op="record_decisions").inc()
        self.policy.failed()

    def _recovered(self) -> None:
        if self.degraded is not None:
            log.warning(
                "decision store back after %.1f s; writing buffered and spilled decisions",
                time.monotonic() - self._degraded_since,
            )
        self.state = StoreState.UP
        self.degraded = None
        self.policy.recovered()
