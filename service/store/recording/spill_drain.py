"""Spilled decisions back into the store: this replica's, or any other's on the same path.

A drain claims a file (``SpillFile.claim``: renamed away under its lock, so each line
is drained by exactly one replica) and writes it batch by batch; the caller's new
decisions go between batches, so a long drain does not hold them up. A batch the store
did not take is read again once it is back (``Replay.rewind``); lines that cannot be
replayed are counted by reason (``SpillLog.count_rejected``) and set aside by
``spill.py``. Drained decisions are counted (``switchboard_decisions_replayed_total``).

A file that cannot be read (permissions, an I/O error) is left where it is for a later
try or another replica, every ``SPILL_CHECK_S``, logged once per kind of error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.recording.spill_log import SPILL_CHECK_S, SpillLog
from mla_switchboard.service.store.rows import Decision as Row
from mla_switchboard.service.store.spill import Replay
from prometheus_client import Counter, Gauge

log = logging.getLogger("switchboard.recorder")

Write = Callable[[Sequence[Row]], int | None]
"""Rows into the store: how many it stored (the rest refused, set aside), or None when
it is failing (``StoreWriter.write``)."""


class SpillDrain:
    def __init__(self, spill: SpillLog, metrics: Metrics, *, batch: int) -> None:
        self._spill = spill
        self._batch = batch
        self._replay: Replay | None = None
        self.replayed = 0
        self._next_check = 0.0
        self._blocked_until = 0.0
        self._error: str | None = None
        self._replayed_total = Counter(
            "switchboard_decisions_replayed",
            "Decisions from a spill file written to the store (at start or once it is back)",
            registry=metrics.registry,
        )
        # this backlog's progress: reset once nothing waits (``progress``)
        self.drained_bytes = 0
        self.drained_lines = 0
        self._lines_drained_total = Counter(
            "switchboard_spill_lines_drained",
            "Spill lines a drain got through (stored, refused or set aside)",
            registry=metrics.registry,
        )
        Gauge(
            "switchboard_spill_lines_pending",
            "Spilled decisions waiting for the store (estimated from the bytes waiting "
            "and the drained lines' mean length)",
            registry=metrics.registry,
        ).set_function(lambda: self.progress()[1])

    def progress(self) -> tuple[int, int, float]:
        """The backlog: bytes waiting, decisions waiting (estimated), and the share of
        this backlog drained so far (0 to 1)."""
        waiting = self._spill.size()
        if self._replay is not None:  # the part of the claimed file already stored
            waiting = max(0, waiting - self._replay.committed_bytes)
        if waiting == 0:
            self.drained_bytes = self.drained_lines = 0
            return 0, 0, 1.0
        mean = self.drained_bytes / self.drained_lines if self.drained_lines else self._sample()
        done = self.drained_bytes / (self.drained_bytes + waiting)
        return waiting, round(waiting / mean) if mean else 0, done

    def _sample(self) -> float:
        """Mean line length of the first 64 KiB of a waiting file (before any drain)."""
        file = self._spill.file
        if file is None:
            return 0.0
        for path in [*file.backlog_files(), file.path]:
            try:
                with path.open("rb") as f:
                    head = f.read(65536)
            except OSError:
                continue
            lines = head.count(b"\n")
            if lines:
                return len(head[: head.rindex(b"\n") + 1]) / lines
        return 0.0

    @property
    def unfinished(self) -> Path | None:
        """The file a drain claimed and has not finished, if any."""
        return None if self._replay is None else self._replay.path

    def look_now(self) -> None:
        """The next drain looks for spill files at once, not at its next check."""
        self._next_check = 0.0

    def work_due(self, *, force: bool = False) -> bool:
        """Anything to drain now: a file claimed, an append not yet drained, or (every
        ``SPILL_CHECK_S``, or now with ``force``) a file another replica left."""
        file = self._spill.file
        if file is None:
            return False
        now = time.monotonic()
        if now < self._blocked_until:
            return False
        if self._replay is not None or self._spill.pending:
            return True
        if not force and now < self._next_check:
            return False
        self._next_check = now + SPILL_CHECK_S
        return file.has_work()

    def drain(
        self,
        write: Write,
        between: Callable[[], None],
        *,
        going: Callable[[], bool],
        probe: bool = False,
        until: float | None = None,
    ) -> None:
        """Batches of spilled decisions into the store (``write``), while ``going`` and
        until ``until``, with ``between`` (new decisions) after each. ``probe``: files
        with nothing for the store (empty, or bad lines only) are taken even while it
        is failing, and nothing runs between."""
        if self._spill.file is None or (self._replay is None and not self.work_due(force=probe)):
            return
        while going():
            if until is not None and time.monotonic() >= until:
                return
            replay = self._claim()
            if replay is None:
                return
            try:
                rows = replay.read(self._batch)
            except OSError as exc:
                self._failed(exc)
                return
            self._count_rejected(replay)
            if rows:
                stored = write(rows)
                if stored is None:
                    replay.rewind()  # read again once the store is back
                    return
                self.drained_bytes += replay.commit(stored, refused=len(rows) - stored)
                self.drained_lines += len(rows)
                self._lines_drained_total.inc(len(rows))
                self.replayed += stored
                self._replayed_total.inc(stored)
            if replay.eof:
                self._replay = None
                self._finish(replay)
            if not probe:
                between()

    def _claim(self) -> Replay | None:
        """The file being drained, or the next one claimed; None when there is none
        (every append so far is drained) or it cannot be claimed (``_failed``)."""
        if self._replay is not None:
            return self._replay
        file = self._spill.file
        assert file is not None
        gen = self._spill.gen
        try:
            self._replay = file.claim()
        except OSError as exc:
            self._failed(exc)
            return None
        if self._replay is None:  # every append so far is in a file taken
            self._spill.mark_drained(gen)
        return self._replay

    def give_up(self) -> None:
        """Leave the file claimed for a later drain, and wait before the next one."""
        self.close()
        self._blocked_until = time.monotonic() + SPILL_CHECK_S

    def close(self) -> None:
        """The file claimed, if any, stays for the next drain (the next start's)."""
        if self._replay is not None:
            self._replay.close()
            self._replay = None

    def _failed(self, exc: OSError) -> None:
        """A spill file that cannot be read (permissions, an I/O error): left where it
        is for a later try or another replica, logged once per kind of error."""
        self.give_up()
        reason = f"{type(exc).__name__}: {exc}"
        if reason != self._error:
            log.error(
                "cannot drain the spill file (retried every %.0f s): %s", SPILL_CHECK_S, reason
            )
        self._error = reason

    def _finish(self, replay: Replay) -> None:
        self._error = None
        replay.finish()
        rejected = replay.rejected_total + replay.refused
        file = self._spill.file
        assert file is not None
        if not rejected:
            log.warning(
                "replayed %d spilled decisions from %s into the store", replay.stored, replay.path
            )
            return
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
            file.rejected_path,
            kept,
        )

    def _count_rejected(self, replay: Replay) -> None:
        for kind, n in replay.take_rejected().items():
            self._spill.count_rejected(kind, n)
