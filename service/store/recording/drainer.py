"""Batches into the database, and what its answers say about it.

The drainer is the only writer of decisions to the database. It writes on its own
thread and waits for the call however long it takes: nothing is lost meanwhile, the
log holds every decision, and a reader never waits on a write that has been in flight
longer than writes take (``degraded`` says ``stalled``). A write that fails is retried
with backoff (100 ms doubling to 2 s). A batch the database refuses for its content
(not for being down) is written row by row, and the rows it refuses are logged and
counted (``switchboard_decisions_rejected_total``): one row it will never take cannot
hold up every other.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence

import psycopg
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.decisions import DecisionStore
from mla_switchboard.service.store.rows import Decision as Row
from prometheus_client import Counter
from sqlalchemy.exc import DataError, IntegrityError

log = logging.getLogger("switchboard.recorder")

CONTENT_REFUSALS = (DataError, IntegrityError, psycopg.DataError, psycopg.IntegrityError)
"""The database refusing a batch for what it holds, not for being down. SQLAlchemy wraps
the driver's errors for the statements it runs; the PostgreSQL batch's ``COPY`` goes to
psycopg directly, whose errors arrive unwrapped."""
MAX_BACKOFF_S = 2.0
MIN_STALL_S = 0.2  # a write in flight this long (or 4 flush intervals) counts as stalled,
STALL_FACTOR = 3  # ... or this many times the slowest of the recent writes,
MAX_STALL_S = 2.0  # ... but never more than this


class Drainer:
    """``stall_s``: the least time a write may be in flight before it is ``stalled``."""

    def __init__(
        self, store: DecisionStore, metrics: Metrics, interval_s: float, stall_s: float | None
    ) -> None:
        self._db = store
        self._metrics = metrics
        self._floor = stall_s if stall_s is not None else max(4 * interval_s, MIN_STALL_S)
        self._recent: deque[float] = deque(maxlen=64)
        self._in_flight_since: float | None = None
        self.down: str | None = None  # why writes fail, None when they go through
        self._down_since = 0.0
        self.backoff_s = 0.0
        self.retry_at = 0.0
        self.attempts = 0
        r = metrics.registry
        self._cpu = Counter(
            "switchboard_decision_writer_cpu_seconds",
            "CPU time the drainer's database writes spent preparing and writing batches",
            registry=r,
        )
        self._rejected = Counter(
            "switchboard_decisions_rejected",
            "Decisions the database refused for their content (logged with the reason)",
            registry=r,
        )

    @property
    def degraded(self) -> str | None:
        """Why the database is not taking decisions now: writes fail, or one has been
        in flight past the stall bound (a database that hangs rather than refuses)."""
        if self.down is not None:
            return self.down
        since = self._in_flight_since
        if since is not None:
            waited = time.monotonic() - since
            if waited > self.stall_bound():
                return f"StoreStalled: a write has not answered for {waited:.2f} s"
        return None

    def stall_bound(self) -> float:
        """A hung database is told from a slow one by comparison: ``STALL_FACTOR``
        times the slowest recent write, at least the floor, at most ``MAX_STALL_S``."""
        slowest = max(self._recent, default=0.0)
        return min(max(self._floor, STALL_FACTOR * slowest), max(MAX_STALL_S, self._floor))

    def write(self, rows: Sequence[Row]) -> bool:
        """One batch into the database: True once it is there (but for the rows it
        refused for their content, logged and counted), False when it failed (retried
        after the backoff, ``retry_at``)."""
        self.attempts += 1
        try:
            self._record(rows)
        except CONTENT_REFUSALS as exc:
            if not self._one_by_one(rows, exc):
                return False
        except Exception as exc:
            self._failed(exc)
            return False
        self._recovered()
        self._metrics.decisions_written.inc(len(rows))
        return True

    def _record(self, rows: Sequence[Row]) -> None:
        cpu0, t0 = time.thread_time(), time.monotonic()
        self._in_flight_since = t0
        try:
            self._db.record_rows(rows)
            self._recent.append(time.monotonic() - t0)
        finally:
            self._in_flight_since = None
            self._cpu.inc(time.thread_time() - cpu0)

    def _one_by_one(self, rows: Sequence[Row], exc: Exception) -> bool:
        log.error(
            "the store refused a batch of decisions (%s); writing them one by one", first_line(exc)
        )
        for row in rows:
            try:
                self._record([row])
            except CONTENT_REFUSALS as one:
                self._rejected.inc()
                log.error("decision %s refused by the store: %s", row.id, first_line(one))
            except Exception as other:
                self._failed(other)
                return False
        return True

    def _failed(self, exc: BaseException) -> None:
        if self.down is None:
            self._down_since = time.monotonic()
            log.warning(
                "decision store unavailable (%s): decisions wait in the log until it is back",
                first_line(exc),
            )
        self.down = f"{type(exc).__name__}: {first_line(exc)}"
        self._metrics.store_errors.labels(op="record_decisions").inc()
        self.backoff_s = min(max(self.backoff_s * 2, 0.1), MAX_BACKOFF_S)
        self.retry_at = time.monotonic() + self.backoff_s

    def _recovered(self) -> None:
        if self.down is not None:
            log.warning(
                "decision store back after %.1f s; storing the decisions the log holds",
                time.monotonic() - self._down_since,
            )
        self.down = None
        self.backoff_s = 0.0
