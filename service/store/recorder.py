"""Writes decisions in the background, in batches, so ``/v1/select`` never waits on disk.

Durability contract (documented in the README): a decision is in memory when its
answer is sent and in the database within ``flush_interval_s`` while the database is
up. A clean shutdown flushes everything. A crash (kill -9) loses at most the
decisions of the last flush interval. While the database is unreachable, decisions
wait in a bounded buffer (``buffer_limit``) and are written when it returns; past
that limit the oldest are dropped and counted in ``switchboard_decisions_dropped_total``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.state import DecisionRecord
from mla_switchboard.service.store import Store

log = logging.getLogger("switchboard.recorder")


class DecisionRecorder:
    def __init__(
        self, store: Store, metrics: Metrics, *, interval_s: float, batch: int, limit: int
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._interval = interval_s
        self._batch = batch
        self._limit = limit
        self._queue: deque[DecisionRecord] = deque()
        self._submitted = 0
        self._written = 0
        self._dropped = 0
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.degraded: str | None = None  # why writes are failing, None when healthy

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="decision-writer", daemon=True)
        self._thread.start()

    def submit(self, record: DecisionRecord) -> None:
        """Hot path: an append and a counter, no lock taken, no I/O."""
        if len(self._queue) >= self._limit:
            self._queue.popleft()
            self._dropped += 1
            self._metrics.decisions_dropped.inc()
        self._queue.append(record)
        self._submitted += 1

    @property
    def pending(self) -> int:
        return len(self._queue)

    def flush(self, timeout_s: float = 3.0) -> bool:
        """Wait until everything submitted before this call is written (or dropped).

        Readers call it first so that a listing shows the caller's own decisions.
        Returns False when the database could not take them in time.
        """
        target = self._submitted
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        with self._cond:
            while self._written + self._dropped < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
                self._wake.set()
        return True

    def stop(self, timeout_s: float = 30.0) -> None:
        self.flush(timeout_s)
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        backoff = self._interval
        while not self._stop:
            self._wake.wait(backoff)
            self._wake.clear()
            while self._queue:
                batch: list[DecisionRecord] = []
                while self._queue and len(batch) < self._batch:
                    batch.append(self._queue.popleft())
                try:
                    self._store.record_decisions(batch)
                except Exception as exc:  # the database is down or refusing: keep them
                    self._queue.extendleft(reversed(batch))
                    if self.degraded is None:
                        log.warning("decision store unavailable, buffering: %s", exc)
                    self.degraded = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    self._metrics.store_errors.labels(op="record_decisions").inc()
                    backoff = min(max(backoff * 2, 0.1), 2.0)
                    break
                self._metrics.decisions_written.inc(len(batch))
                if self.degraded is not None:
                    log.warning("decision store back; buffered decisions written")
                self.degraded = None
                backoff = self._interval
                with self._cond:
                    self._written += len(batch)
                    self._cond.notify_all()
            with self._cond:
                self._cond.notify_all()
