"""Keeping a replica's evidence indexes in step with the store, off the event loop.

- **Start** (the first load): the newest *evidence snapshot* is restored
  (``core/evidence/snapshot.py``: each pod's counted results per situation and backend,
  as bytes, kept in parts of a few hundred KB and decoded one at a time, with the
  measurement id and gaps it covers; ``service/store/snapshots.py``), cut at the
  window, then the wrong results it covers are read again through their own index (an
  admin's clear changes them) and only the rows after it are read; the
  result is exactly what reading the whole window gives, so a start costs the pods
  that count plus the recent rows, not the window's history. Without a usable snapshot
  (none yet, damaged, another ``per_pod``) the whole window is read, as
  ``last_load.fallback`` and the log say. Either way the indexes are built from one
  bulk loader (``core.evidence.EvidenceLoader``) in steps that let the event loop in.
  Only the window is read (from its first row, found through the ``at`` index), in
  pages of plain driver rows, each pod's newest results kept as they stream (the bound
  is applied as the rows stream, not in SQL: a window function sorts every row of the
  window all the same). A load that read many rows leaves a new snapshot, written by
  the background thread; a running replica also makes one from the newest and the rows
  after it every ``SNAPSHOT_EVERY_S`` when ``SNAPSHOT_ROWS`` came since, so the next
  start, on any replica, reads the recent rows only. After a load, and after a
  snapshot is written, the C library's free memory is handed back (``service/heap.py``).
- **Reload** (asked for, or the store's ``evidence_epoch`` moved, which only a
  replica of an older release still does): in place (``reread``), no index rebuilt:
  the rows after the cursors, then the window's failures read again and put in place
  of those held, then expiry. Its cost is the failures and the new rows.
- **This replica's reports** are applied as they are accepted (``apply_local``).
- **Other replicas' reports**: when ``evidence_version`` changes, only the rows this
  replica has not read yet are read (:class:`RowCursor`: every id up to a high-water
  mark, except the *gaps*, ids below it not seen yet; PostgreSQL assigns ids before
  commit, so a row can become visible after a higher one was read; gaps are asked for
  again for ``GAP_TTL_S`` and then forgotten, as a rolled-back insert leaves one for
  good).
- Nothing is counted twice: a report applied here is remembered (by its report id)
  until the store read meets it, and a report read from the store in the last
  ``RECENT_S`` is not applied again when this replica's own route applies it late.
- **An admin's clear** of a situation's failures is a row of its own
  (``evidence_clears``), read like the others and applied in place: those failures
  are forgotten in every index, nothing is rebuilt (a rebuild of 100,000 results held
  two sets of indexes at once and seconds of CPU, on every replica).
- **Expiry**: evidence older than the window (``SWITCHBOARD_MEASURED_MAX_AGE_DAYS``)
  is pruned in the background, at most once a minute, each index popping its heap of
  expiry times up to the cutoff (what expired, not every pod) in steps; a prune that
  changed something counts as new evidence.

There is no periodic full reload: an idle replica reads nothing but the version row.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime, timedelta

from mla_switchboard.core.evidence import EvidenceLoader, Observation
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.collector import Collector, paused
from mla_switchboard.service.evidence.ledger import ReportLedger, key_of
from mla_switchboard.service.evidence.trust import TrustedEvidence
from mla_switchboard.service.evidence.window import (
    SNAPSHOT_EVERY_S,
    SNAPSHOT_ROWS,
    LoadNote,
    RowCursor,
    WindowReader,
)
from mla_switchboard.service.heap import trim_free_memory
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.priority import let_the_loop_in, lower_this_thread
from mla_switchboard.service.store.config import ConfigStore
from mla_switchboard.service.store.measurements import EvidenceRows, MeasurementStore
from mla_switchboard.service.store.snapshots import SnapshotCover, SnapshotStore

log = logging.getLogger("switchboard.evidence")


@dataclass(eq=False)
class EvidenceSync:
    """Full reloads, incremental reads, local reports and expiry for one replica's
    :class:`TrustedEvidence` (module docstring). ``on_change`` is called, outside any
    lock, after every change that decisions must see (the runtime re-publishes its
    inputs; a cached decision is decided again only when its own situation's evidence
    moved)."""

    config: ConfigStore
    measurement_store: MeasurementStore
    trusted: TrustedEvidence
    _: KW_ONLY
    max_age: timedelta
    poll_s: float
    on_change: Callable[[], None]
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    collector: Collector | None = None
    """Paused while a full reload runs (``service/collector.py``); None: left alone."""
    snapshots: SnapshotStore | None = None
    """Where evidence snapshots are kept (``service/store/snapshots.py``); None: every
    full load reads the window's rows and none is written."""

    def __post_init__(self) -> None:
        # prune at most this often: a pass costs what expired (nothing when nothing did)
        self._prune_every_s = min(60.0, self.max_age.total_seconds() / 10)
        self._pruned_at = 0.0
        self._sync_lock = threading.Lock()  # one store read (full or incremental) at a time
        self._apply_lock = threading.Lock()  # dedupe and apply, atomically
        self._ledger = ReportLedger(self.clock)  # guarded by the apply lock
        self._pending: list[Observation] | None = None  # applied here during a full read
        self._measurements = RowCursor()
        self._failures = RowCursor()
        # Reports applied here (a count), and how many of them a finished read had
        # committed before it began (so it met their rows): ``read_back`` reads again
        # while the second is behind. Counted rather than flagged: a read back that
        # arrives while a read runs must wait for it and read again, which a flag
        # cleared as that read began cannot tell it.
        self._local_applied = 0
        self._local_read = 0
        self._clears = RowCursor()
        self._versions: dict[str, int] = {}  # the latest the poller saw
        self._applied: dict[str, int] = {}  # the versions the indexes reflect
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reloads: list[_Reload] = []  # full reloads asked for, done by the thread
        self._reloads_lock = threading.Lock()
        self.degraded: str | None = None
        self.last_load = LoadNote()
        self.rows_caught_up = 0  # measurement rows the last incremental read read
        self._loaded = False  # whether the indexes hold a full load (a reload rereads)
        self._unsaved: tuple[SnapshotCover, int, list[bytes]] | None = None  # made by a load
        self._snapshot_checked = time.monotonic()  # a start's own load writes one if due

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """The first full load, in the caller's thread, then the background thread."""
        self.notify(self.config.versions())
        self.full_reload()
        self._thread = threading.Thread(target=self._loop, name="evidence-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def notify(self, versions: Mapping[str, int]) -> None:
        """The store's versions, as the config poller just read them (never blocks)."""
        self._versions = dict(versions)
        if any(self._versions.get(k) != self._applied.get(k) for k in _KEYS):
            self._wake.set()

    def _loop(self) -> None:
        lower_this_thread()  # evidence upkeep waits while the event loop wants the CPU
        while not self._stop.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.step()
                if self.degraded is not None:
                    log.warning("evidence store reachable again")
                self.degraded = None
            except Exception as exc:  # the store may be down: try again next tick
                if self.degraded is None:
                    log.warning("evidence not refreshed: %s: %s", type(exc).__name__, exc)
                self.degraded = f"{type(exc).__name__}: {first_line(exc)}"

    def reload(self, timeout_s: float = 60.0) -> bool:
        """A full reload, done by the background thread (at its lower priority, so a
        replica's selects go first) and waited for; the store's error, if any, is
        raised here. False when it is still running after ``timeout_s`` (it goes on).
        In the caller's thread when there is no background thread."""
        thread = self._thread
        if thread is None or not thread.is_alive() or thread is threading.current_thread():
            self._reload()
            return True
        asked = _Reload()
        with self._reloads_lock:
            self._reloads.append(asked)
        self._wake.set()
        if not asked.done.wait(timeout_s):
            log.warning("evidence reload still running after %g s; it goes on", timeout_s)
            return False
        if asked.error is not None:
            raise asked.error
        return True

    def step(self) -> None:
        """What the background thread does on each tick: a full reload when one was
        asked for or the epoch changed, an incremental read when the version did, a
        prune when one is due."""
        versions = self._versions
        with self._reloads_lock:
            asked, self._reloads = self._reloads, []
        if asked:
            try:
                self._reload()
            except Exception as exc:
                for r in asked:
                    r.error = exc
                raise
            finally:
                for r in asked:
                    r.done.set()
        elif versions.get("evidence_epoch") != self._applied.get("evidence_epoch"):
            self._reload()
        elif versions.get("evidence_version") != self._applied.get("evidence_version"):
            self.catch_up()
        if time.monotonic() - self._pruned_at >= self._prune_every_s:
            self.prune()
        if self._unsaved is not None:
            self.save_snapshot()
        elif time.monotonic() - self._snapshot_checked >= SNAPSHOT_EVERY_S:
            self._snapshot_checked = time.monotonic()
            with paused(self.collector):
                self.refresh_snapshot()

    # ---------------------------------------------------------------- writes

    def read_back(self) -> None:
        """``catch_up`` when this replica applied reports of its own since the last one
        (their rows are in memory, not yet in what was read: ``read_through``)."""
        if self._local_read < self._local_applied:
            self.catch_up()

    def apply_local(self, observations: Iterable[Observation]) -> bool:
        """This replica's own new evidence (already stored), applied at once."""
        with self._apply_lock:
            self._local_applied += 1
            fresh = self._ledger.apply_here(observations)
            if self._pending is not None:
                self._pending.extend(fresh)
            changed = self.trusted.add(fresh)
        if changed:
            self.on_change()
        return changed

    def _reload(self) -> None:
        """A reload: in place once the indexes hold a load (``reread``), the first
        full load otherwise."""
        if self._loaded:
            self.reread()
        else:
            self.full_reload()

    def reread(self) -> None:
        """A reload in place (module docstring): the failures of the window are the
        only evidence a store change other than a new row alters (an admin's clear,
        also an older release's, which moves ``evidence_epoch``). A failure applied
        here while they are read is kept unless the read has it."""
        with self._sync_lock:
            versions = self.config.versions()
            clears = self.measurement_store.last_clear_id()
            with self._apply_lock:
                self._pending = []
            try:
                changed = self._catch_up()  # the new rows, and this replica's own met
                note = LoadNote(snapshot_id=self.last_load.snapshot_id)
                note.rows_read = self.rows_caught_up
                now = self.clock()
                since = now - self.max_age
                keys: dict[str, datetime | None] = {}
                failures: list[Observation] = []
                note.wrong_rows_read = self._window().wrong_results(
                    since,
                    self.measurement_store.first_id(False, since) - 1,
                    self._measurements.after,
                    failures.extend,
                    keys,
                )
                start = self.measurement_store.first_id(True, since) - 1
                cursor = RowCursor(start)
                seen = self._read_pages(True, since, start, failures.extend, keys)
                cursor.advance(seen, time.monotonic(), start=start, ordered=True)
                keys.update((key_of(o), o.at) for o in failures if o.source)
                with self._apply_lock:
                    pending = [o for o in self._pending or [] if not o.ok]
                    failures.extend(o for o in pending if not o.source or key_of(o) not in keys)
                    changed = self.trusted.replace_failures(failures) or changed
                    self._failures = cursor
                    self._clears = RowCursor(clears)
                    self._ledger.met(keys)
            finally:
                with self._apply_lock:
                    self._pending = None
            self._applied["evidence_epoch"] = versions.get("evidence_epoch", 0)
        self.last_load = note
        changed = self.trusted.prune(now, self.max_age, let_the_loop_in) or changed
        if changed:
            self.on_change()

    def full_reload(self) -> None:
        """Rebuild every index from the store (the window only) and swap them in,
        with the cycle collector paused (``service/collector.py``): the build makes a
        new index's objects by the hundred thousand, and the one it replaces is freed
        meanwhile, neither of which should set a collection off.

        A report applied here while the store is read may be missing from the read
        (its commit came after the read's snapshot): it is kept, unless the read has it
        already, so "this replica at once" holds and nothing counts twice."""
        with paused(self.collector):
            self._full_reload()

    def _full_reload(self) -> None:
        with self._sync_lock:
            versions = self.config.versions()
            clears = self.measurement_store.last_clear_id()  # what the rows read below reflect
            with self._apply_lock:
                self._pending = []
            try:
                fresh = self.trusted.fresh()
                loader = EvidenceLoader(fresh.all.per_pod)
                now = self.clock()
                since = now - self.max_age
                read_keys: dict[str, datetime | None] = {}
                cursor, note = self._window().read_into(loader, since, now, read_keys)
                start = self.measurement_store.first_id(True, since) - 1
                failures = RowCursor(start)
                seen = self._read_pages(True, since, start, loader.add, read_keys)
                failures.advance(seen, time.monotonic(), start=start, ordered=True)
                if note.snapshot_id is None or note.rows_read >= SNAPSHOT_ROWS:
                    self._unsaved = self._window().encode(loader, cursor)
                fresh.load(loader, let_the_loop_in)
                del loader
                with self._apply_lock:
                    pending = self._pending or []
                    fresh.add(o for o in pending if not o.source or key_of(o) not in read_keys)
                    replaced = self.trusted.swap(fresh)
                    self._ledger.met(read_keys)
                    self._measurements, self._failures = cursor, failures
                    self._clears = RowCursor(clears)
                    self.trusted.note_read_through(cursor.after, failures.after)
                self.last_load = note
                self._loaded = True
            finally:
                with self._apply_lock:
                    self._pending = None
            self._applied = {k: versions.get(k, 0) for k in _KEYS}
        self.on_change()  # decisions use the new set from here on
        replaced.retire(let_the_loop_in)
        trim_free_memory()  # what the load freed, back to the system (``service/heap.py``)

    # ------------------------------------------------------------- snapshots

    def save_snapshot(self) -> int | None:
        """Write the snapshot the last full load made, if any (off the start's path:
        the background thread's first tick); its id."""
        unsaved, self._unsaved = self._unsaved, None
        if unsaved is None or self.snapshots is None:
            return None
        cover, pods, parts = unsaved
        del unsaved
        per_pod = self.trusted.all.per_pod
        made = self.snapshots.save(self.clock(), per_pod, cover, pods, _draining(parts))
        trim_free_memory()  # the parts, held since the load, are freed now
        return made

    def refresh_snapshot(self, *, force: bool = False) -> int | None:
        """A new snapshot when one is due (``WindowReader.refresh``); its id."""
        now = self.clock()
        made = self._window().refresh(now, self.max_age, self.trusted.all.per_pod, force=force)
        if made is not None:
            trim_free_memory()  # the loader it built and the parts it wrote, freed
        return made

    def catch_up(self) -> bool:
        """Read and apply only the rows this replica has not read (module docstring)."""
        with self._sync_lock:
            changed = self._catch_up()
        if changed:
            self.on_change()
        return changed

    def _catch_up(self) -> bool:
        """``catch_up``, the caller holding the sync lock (no ``on_change``)."""
        covered = self._local_applied  # their rows were committed before this read
        versions = self.config.versions()
        since = self.clock() - self.max_age
        read: list[Observation] = []
        for failures, cursor in ((False, self._measurements), (True, self._failures)):
            now = time.monotonic()
            seen = self._read_pages(failures, since, cursor.after, read.extend, {})
            if cursor.gaps:
                again = self._read(failures)(since, ids=sorted(cursor.gaps))
                read.extend(again.observations)
                seen.extend(again.ids)
            if not failures:
                self.rows_caught_up = len(seen)
            cursor.advance(seen, now)
        with self._apply_lock:
            new = self._ledger.not_applied_here(read)
            self._ledger.met({key_of(o): o.at for o in read if o.source})
            changed = self.trusted.add(new)
            self.trusted.note_read_through(self._measurements.after, self._failures.after)
            self._local_read = max(self._local_read, covered)
        # clears after the rows: a failure stored before a clear is read first,
        # then forgotten; one noted after the clear's time stays. A failure whose
        # commit overlaps the clear's (its time earlier, its row not yet visible to
        # the store's update) is forgotten here but stays active in the store, until
        # the next full reload: a window of one transaction plus the replicas'
        # clock skew, which a clear by row ids would close.
        changed = self._apply_clears() or changed
        self._applied["evidence_version"] = versions.get("evidence_version", 0)
        return changed

    def _apply_clears(self) -> bool:
        """The admins' clears this replica has not applied, in place (caller holds the
        sync lock)."""
        cursor = self._clears
        now = time.monotonic()
        read = self.measurement_store.clear_rows(after=cursor.after)
        if cursor.gaps:
            read += self.measurement_store.clear_rows(ids=sorted(cursor.gaps))
        changed = False
        for clear in read:
            backend = _backend(clear.backend)
            if clear.backend is not None and backend is None:
                continue
            if self.trusted.clear_failures(clear.situation, backend, clear.at):
                changed = True
        cursor.advance([c.id for c in read], now)
        return changed

    def prune(self) -> bool:
        """Drop evidence older than the window; True (and ``on_change``) when any went.
        In steps, letting the event loop in between them."""
        self._pruned_at = time.monotonic()
        changed = self.trusted.prune(self.clock(), self.max_age, let_the_loop_in)
        if changed:
            self.on_change()
        return changed

    # --------------------------------------------------------------- helpers

    def _read(self, failures: bool) -> Callable[..., EvidenceRows]:
        return (
            self.measurement_store.failure_rows
            if failures
            else self.measurement_store.measurement_rows
        )

    def _read_pages(
        self,
        failures: bool,
        since: datetime,
        after: int,
        sink: Callable[[list[Observation]], object],
        keys: dict[str, datetime | None],
    ) -> list[int]:
        """Every row with an id above ``after``, page by page, each page's observations
        into ``sink`` (and their report keys, with a time, into ``keys``); the ids read."""
        seen: list[int] = []
        while True:
            page = self._read(failures)(since, after=after)
            sink(page.observations)
            keys.update((key_of(o), o.at) for o in page.observations if o.source)
            seen.extend(page.ids)
            if not page.more:
                return seen
            after = page.ids[-1]

    def _window(self) -> WindowReader:
        return WindowReader(self.measurement_store, self.snapshots, self._local_reports)

    def _local_reports(self) -> set[str]:
        with self._apply_lock:
            return self._ledger.local_report_ids()


_KEYS = ("evidence_version", "evidence_epoch")


class _Reload:
    """One caller's request for a full reload, and how it went."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: Exception | None = None


def _draining(parts: list[bytes]) -> Iterator[bytes]:
    """``parts`` in order, each let go of by the list as it is handed on: a part once
    written is freed, not held until the last one is."""
    parts.reverse()
    while parts:
        yield parts.pop()


def _backend(name: str | None) -> Backend | None:
    """A stored backend name as the registry's, None for one it does not know (any
    longer): a clear of it has nothing to forget here."""
    try:
        return None if name is None else Backend(name)
    except ValueError:
        return None
