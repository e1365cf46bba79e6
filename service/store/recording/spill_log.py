"""The recorder's side of the spill file: appending, and whether it takes decisions now.

The file itself (format, locks, fsync) is ``service/store/spill.py``. Here: why it
cannot take decisions now (``error``, shown by ``/readyz``; None when it can), how
often a file that refused is tried again (``SPILL_RETRY_S``) or looked at while idle
(``SPILL_CHECK_S``), and which of this process's appends no drain has taken yet
(``pending``: a flush waits for them). Appends are counted
(``switchboard_decisions_spilled_total``); so are lines set aside in
``<spill>.rejected`` (``switchboard_decisions_rejected_total``, by reason), whether a
drain found them bad or the store refused them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.rows import Decision as Row
from mla_switchboard.service.store.spill import SpillFile
from prometheus_client import Counter

log = logging.getLogger("switchboard.recorder")

SPILL_RETRY_S = 1.0  # a spill file that refused is tried again this often, not every tick
SPILL_CHECK_S = 5.0  # how often a healthy writer looks for other replicas' spill files


class SpillLog:
    """``file`` None: no spill path (decisions stay in memory). ``progress`` is
    notified when a drain has taken every append so far: ``flush`` waits on it."""

    def __init__(
        self, file: SpillFile | None, metrics: Metrics, progress: threading.Condition
    ) -> None:
        self.file = file
        self._progress = progress
        self._off = file is not None and file.limit_bytes <= 0
        # why it cannot take decisions now (None: it can), and when to try again
        self.error: str | None = None if file else "off: no spill path"
        self._retry_at = 0.0
        self.gen = 0  # appends this process made ...
        self._drained_gen = 0  # ... of which every one up to here is drained
        self.undrained = 0  # decisions appended since the last drain took them all
        r = metrics.registry
        self._spilled_total = Counter(
            "switchboard_decisions_spilled",
            "Decisions appended to the spill file (the store could not take them, or memory "
            "was past its budget)",
            registry=r,
        )
        self._rejected_total = Counter(
            "switchboard_decisions_rejected",
            "Spill file lines that could not be replayed, set aside in <spill>.rejected",
            ["reason"],
            registry=r,
        )

    @property
    def path(self) -> Path | None:
        return None if self.file is None else self.file.path

    @property
    def pending(self) -> bool:
        """This replica spilled decisions that no drain has taken since."""
        return self.gen > self._drained_gen

    def size(self) -> int:
        """Bytes waiting for the store (``SpillFile.backlog_bytes``): the spill file
        and the files being drained or left by a drain or a journal cut short."""
        return 0 if self.file is None else self.file.backlog_bytes()

    def check(self) -> str | None:
        """At start: can the spill file be written? The reason when not (logged with
        the path, and shown without it by ``/readyz``); the service answers anyway."""
        if self.file is None:
            return self.error
        self.error = self.file.probe()
        if self.error is not None:
            self._retry_at = time.monotonic() + SPILL_RETRY_S
            log.error(
                "the spill file %s cannot be written (%s): while the database is down, "
                "decisions stay in memory (SWITCHBOARD_BUFFER_LIMIT_MB) and the oldest "
                "are dropped past it; a crash then loses them all",
                self.file.path,
                self.error,
            )
        return self.error

    def probe_again(self) -> None:
        """A spill file that could not be written is looked at again now and then, so
        that ``/readyz`` clears once the volume is fixed, not only at the next outage."""
        if self.file is None or self._off or self.error is None:
            return
        if time.monotonic() < self._retry_at:
            return
        error = self.file.probe()
        if error is None:
            log.warning("the spill file %s can be written again", self.file.path)
        self.error = error
        self._retry_at = time.monotonic() + SPILL_CHECK_S

    def can_take(self) -> bool:
        """Worth an append now: a spill file that refused waits for its retry time."""
        if self.file is None or self._off:
            return False
        return self.error is None or time.monotonic() >= self._retry_at

    def append(self, rows: Sequence[Row], *, retry_now: bool = False) -> int:
        """Append to the spill file; count it, and keep ``error`` current. Returns how
        many of ``rows`` (the first ones) it took."""
        if self.file is None or self._off or not rows:
            return 0
        if not retry_now and self.error and time.monotonic() < self._retry_at:
            return 0
        result = self.file.append(rows)
        if result.count:
            self.gen += 1
            self.undrained += result.count
            self._spilled_total.inc(result.count)
        if result.error is None:
            if self.error is not None and not self.error.startswith("off"):
                log.warning("the spill file %s takes decisions again", self.file.path)
            self.error = None
        else:
            if result.error != self.error:
                log.error(
                    "the spill file %s took %d of %d decisions: %s; the rest stay in memory "
                    "(SWITCHBOARD_BUFFER_LIMIT_MB), retried every %.0f s",
                    self.file.path,
                    result.count,
                    len(rows),
                    result.error,
                    SPILL_RETRY_S,
                )
            self.error = result.error
            self._retry_at = time.monotonic() + SPILL_RETRY_S
        return result.count

    def mark_drained(self, gen: int) -> None:
        """A drain took every append up to ``gen``."""
        with self._progress:
            if gen > self._drained_gen:
                self._drained_gen = gen
                self.undrained = 0
            self._progress.notify_all()

    def count_rejected(self, kind: str, n: int) -> None:
        self._rejected_total.labels(reason=kind).inc(n)

    def set_aside(self, refused: Sequence[tuple[Row, str]]) -> str:
        """Rows the store refused for their content, each with the reason: counted,
        and kept in ``<spill>.rejected`` when there is a spill path. Says where."""
        self.count_rejected("store_refused", len(refused))
        if self.file is None:
            return "lost (no spill path)"
        self.file.set_aside(refused)
        return f"set aside in {self.file.rejected_path}"
