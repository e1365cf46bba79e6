"""Writes decisions in the background, in batches, so ``/v1/select`` never waits on disk.

Durability contract (docs/reliability.md): a decision is in memory when its answer is
sent and in the database within ``flush_interval_s`` while the database is up. A clean
shutdown flushes everything it can within ``shutdown_flush_s``; whatever the database
cannot take by then goes to the spill file, which the next start on the same settings
writes to the store (idempotent: decision ids) and removes. A crash (kill -9) loses
at most the decisions of the last flush interval. While the database is unreachable,
decisions wait in a bounded buffer (``buffer_limit``) and the writer retries with
backoff (50 ms doubling to 2 s, whoever waits for a flush); past the limit the oldest
are dropped. Every spill, replay and drop is logged with its count and counted in
``switchboard_decisions_{spilled,replayed,dropped}_total``.

The hot path hands over one plain tuple per decision (``Row``); turning the request
into JSON and the rows into SQL happens here, on the writer thread, in batches.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from mla_switchboard.service.fleet.shapes import shape_of_json
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.decisions import ROW_FIELDS, Row
from prometheus_client import Counter

log = logging.getLogger("switchboard.recorder")

MAX_BACKOFF_S = 2.0


class DecisionRecorder:
    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        *,
        interval_s: float,
        batch: int,
        limit: int,
        spill_path: Path | None = None,
        shutdown_flush_s: float = 5.0,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._interval = interval_s
        self._batch = batch
        self._limit = limit
        self.spill_path = spill_path
        self._shutdown_flush_s = shutdown_flush_s
        self._queue: deque[Row] = deque()
        self._inflight: list[Row] = []
        self._take = threading.Lock()  # writer vs. stop(): a batch is in the queue or in flight
        self._submitted = 0
        self._written = 0
        self._dropped = 0
        self._dropped_logged = 0
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._retry_at = 0.0
        self.attempts = 0  # store writes tried (the backoff test counts them)
        self.degraded: str | None = None  # why writes are failing, None when healthy
        r = metrics.registry
        self._spilled_total = Counter(
            "switchboard_decisions_spilled",
            "Decisions written to the spill file at shutdown (the store could not take them)",
            registry=r,
        )
        self._writer_cpu = Counter(
            "switchboard_decision_writer_cpu_seconds",
            "CPU time the decision writer thread spent preparing and writing batches",
            registry=r,
        )
        self._replayed_total = Counter(
            "switchboard_decisions_replayed",
            "Decisions from a spill file written to the store at start",
            registry=r,
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="decision-writer", daemon=True)
        self._thread.start()

    def submit(self, row: Row) -> None:
        """Hot path: an append and a counter, no lock taken, no I/O, no serialising."""
        if len(self._queue) >= self._limit:
            self._queue.popleft()
            self._dropped += 1
            self._metrics.decisions_dropped.inc()
        self._queue.append(row)
        self._submitted += 1

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._inflight)

    def flush(self, timeout_s: float = 3.0, *, wake: bool = True) -> bool:
        """Wait until everything submitted before this call is written (or dropped).

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
            while self._written + self._dropped < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def stop(self) -> None:
        """Flush what the store takes within ``shutdown_flush_s``; spill the rest."""
        self.flush(self._shutdown_flush_s)
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(2.0)
        with self._take:
            leftover = [*self._inflight, *self._queue]
            self._queue.clear()
            self._inflight = []
        if leftover:
            self._spill(leftover)
        self._log_drops()

    # ------------------------------------------------------------------ writer
    def _run(self) -> None:
        backoff = self._interval
        while not self._stopping.is_set():
            if self.degraded is None or not self._queue:
                self._wake.wait(self._interval)
            else:  # failing: only the backoff (or stop) ends the wait, never a flush
                self._stopping.wait(max(0.0, self._retry_at - time.monotonic()))
            self._wake.clear()
            self._log_drops()
            while self._queue and not self._stopping.is_set():
                with self._take:
                    batch: list[Row] = []
                    while self._queue and len(batch) < self._batch:
                        batch.append(self._queue.popleft())
                    self._inflight = batch
                cpu0 = time.thread_time()
                try:
                    self.attempts += 1
                    self._store.record_rows(batch)
                except Exception as exc:  # the database is down or refusing: keep them
                    with self._take:
                        self._queue.extendleft(reversed(self._inflight))
                        self._inflight = []
                    if self.degraded is None:
                        log.warning("decision store unavailable, buffering: %s", exc)
                    self.degraded = f"{type(exc).__name__}: {first_line(exc)}"
                    self._metrics.store_errors.labels(op="record_decisions").inc()
                    backoff = min(max(backoff * 2, 0.1), MAX_BACKOFF_S)
                    self._retry_at = time.monotonic() + backoff
                    break
                with self._take:
                    self._inflight = []
                self._writer_cpu.inc(time.thread_time() - cpu0)
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

    def _log_drops(self) -> None:
        dropped = self._dropped - self._dropped_logged
        if dropped:
            self._dropped_logged += dropped
            log.error(
                "dropped %d decisions: the buffer limit (%d) was reached while the store "
                "could not take them (%d dropped since start)",
                dropped,
                self._limit,
                self._dropped,
            )

    # ------------------------------------------------------------ spill file
    def _drop(self, n: int, why: str) -> None:
        self._dropped += n
        self._metrics.decisions_dropped.inc(n)
        log.error("dropped %d decisions: %s", n, why)
        self._dropped_logged += n

    def _spill(self, rows: Sequence[Row]) -> None:
        if self.spill_path is None:
            self._drop(len(rows), "the store could not take them at shutdown and no spill path")
            return
        try:
            lines = "".join(_spill_line(r) for r in rows)
            _append_locked(self.spill_path, lines)
        except Exception as exc:
            self._drop(len(rows), f"could not write the spill file {self.spill_path}: {exc}")
            return
        self._spilled_total.inc(len(rows))
        log.error(
            "spilled %d decisions to %s: the store could not take them at shutdown (%s); "
            "the next start with the same settings writes them to the store",
            len(rows),
            self.spill_path,
            self.degraded or "flush timed out",
        )

    def replay_spill(self) -> int:
        """At start: write every spilled decision found to the store, then remove the
        file. Safe to repeat (inserts skip known ids); a file whose rows could not all
        be written stays for the next start. Returns the number of decisions written."""
        if self.spill_path is None:
            return 0
        path = self.spill_path
        total = 0
        claimed: list[Path] = sorted(path.parent.glob(path.name + ".replay-*"))
        if path.exists():
            mine = path.with_name(f"{path.name}.replay-{os.getpid()}-{time.time_ns()}")
            with contextlib.suppress(FileNotFoundError):  # another replica took it first
                path.rename(mine)
                claimed.append(mine)
        for f in claimed:
            try:
                rows, bad = _read_spill(f)
                for i in range(0, len(rows), self._batch):
                    self._store.record_rows(rows[i : i + self._batch])
            except Exception as exc:
                log.error("could not replay spill file %s (kept for the next start): %s", f, exc)
                continue
            f.unlink()
            total += len(rows)
            self._replayed_total.inc(len(rows))
            log.warning("replayed %d spilled decisions from %s into the store", len(rows), f)
            if bad:
                self._drop(bad, f"unreadable lines in spill file {f}")
        return total


def _spill_line(row: Row) -> str:
    created = row[1]
    return (
        json.dumps(
            [row[0], created.isoformat(), *row[2:]],
            separators=(",", ":"),
        )
        + "\n"
    )


def _read_spill(path: Path) -> tuple[list[Row], int]:
    rows: list[Row] = []
    bad = 0
    with path.open("r", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # a replica still appending finishes first
        for line in f:
            try:
                v = json.loads(line)
                if len(v) == ROW_FIELDS:
                    rows.append((v[0], datetime.fromisoformat(v[1]), *v[2:]))
                else:  # spilled before shapes: the whole request as JSON text
                    shape = shape_of_json(v[8])
                    rows.append(
                        (
                            v[0],
                            datetime.fromisoformat(v[1]),
                            *v[2:8],
                            shape.id,
                            v[9],
                            shape.json,
                            v[10],
                        )
                    )
            except (ValueError, IndexError, TypeError):
                bad += 1  # a line cut short by a crash while spilling
    return rows, bad


def _append_locked(path: Path, text: str) -> None:
    """Append under an exclusive lock to the file that is *still* at ``path`` (a
    replaying replica may have renamed it away between our open and our lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(10):
        with path.open("a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                continue
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
            return
    raise OSError(f"spill file {path} kept moving")
