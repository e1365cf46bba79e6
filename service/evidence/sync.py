"""Keeping a replica's evidence indexes in step with the store, off the event loop.

- **Full reload** (at start, and when the store's ``evidence_epoch`` moved, which only
  a replica of an older release still does): a new set of indexes is built from the
  store and swapped in at once. Only the window is read (from its first row, found
  through the ``at`` index), in pages of plain driver rows, into a bulk loader that
  keeps each pod's newest results as it reads (``core.evidence.EvidenceLoader``), and
  the loader files every pod once into each index that trusts it: memory follows what
  counts, CPU follows the rows of the window, and every step (a page, a thousand rows,
  a few thousand pods) ends by letting the event loop in. The replaced set is emptied
  in the same steps (``Indexes.retire``), not freed at once. The bound per pod is
  applied as the rows stream, not in SQL: a window function (the newest rows per pod)
  sorts every row of the window all the same, and took 4.5 s for 650,000 rows on
  SQLite, three times reading them (1.2 s on PostgreSQL, which then sends as many).
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime, timedelta

from mla_switchboard.core.evidence import EvidenceLoader, Observation, report_key
from mla_switchboard.core.evidence.snapshot import (
    SnapshotDamaged,
    decode_snapshot,
    encode_snapshot,
)
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.collector import Collector, paused
from mla_switchboard.service.evidence.trust import TrustedEvidence
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.priority import let_the_loop_in, lower_this_thread
from mla_switchboard.service.store.config import ConfigStore
from mla_switchboard.service.store.measurements import EvidenceRows, MeasurementStore
from mla_switchboard.service.store.snapshots import SnapshotCover, SnapshotStore

log = logging.getLogger("switchboard.evidence")

GAP_TTL_S = 60.0
"""How long an id below the high-water mark is asked for again before it is forgotten."""
MAX_GAPS = 1000
"""Most gaps remembered per table (the highest ids are kept)."""
RECENT_S = 120.0
"""How long a report read from the store is remembered, for the route that stored it."""
LOCAL_TTL_S = 3600.0
"""How long a report applied here waits for the store read to meet it."""
ADD_STEP = 1000
"""Rows a full reload files between two turns of the event loop (about a millisecond)."""
RELOAD_PAGE = 1000
"""Rows per query of a full reload: the driver turns a page into rows in one call,
holding the interpreter (about 1 us a row), so a page is a step of its own."""
SNAPSHOT_ROWS = 20_000
"""Rows read after a snapshot that make a new one worth writing (a start reads them)."""
SNAPSHOT_EVERY_S = 600.0
"""The least time between two snapshots a replica writes while it runs."""


@dataclass
class LoadNote:
    """How the last full load went: from a snapshot (``snapshot_id``) plus the rows
    after it, or from the window's rows (``fallback`` says why no snapshot was used).
    ``rows_read``: measurement rows read (after the snapshot, or all of the window's),
    ``wrong_rows_read``: the wrong results a snapshot covers, read again."""

    snapshot_id: int | None = None
    pods_restored: int = 0
    rows_read: int = 0
    wrong_rows_read: int = 0
    fallback: str | None = None


class RowCursor:
    """Which rows of one table this replica has read: every id up to ``after``, except
    the ``gaps`` (id -> monotonic time it is forgotten)."""

    def __init__(self, after: int = 0) -> None:
        self.after = after
        self.gaps: dict[int, float] = {}

    def advance(
        self, seen: Iterable[int], now: float, start: int | None = None, *, ordered: bool = False
    ) -> None:
        """Note the ids one read returned. Ids between ``start`` (default: the old
        high-water mark) and the highest seen that were not returned become gaps.
        ``ordered``: the ids come ascending, each once (a full read's pages): no sort of
        hundreds of thousands in one call, which holds the interpreter for 50 ms."""
        # a full read's list is used as it is (a copy of 650,000 ids: 8 ms in one call)
        ids = seen if ordered and isinstance(seen, list) else sorted(set(seen))
        if self.gaps:
            for i in ids:
                self.gaps.pop(i, None)
        if ids and ids[-1] > self.after:
            highest = ids[-1]
            low = self.after if start is None else start
            missing: list[int] = []
            previous = low
            if ordered and ids[0] == low + 1 and ids[-1] - ids[0] == len(ids) - 1:
                ids = []  # every id from the start on: no gap (the usual full read)
            for i in ids:
                if i > previous + 1:
                    missing.extend(range(max(previous + 1, i - MAX_GAPS), i))
                    missing = missing[-MAX_GAPS:]
                previous = max(previous, i)
            for i in missing:
                self.gaps.setdefault(i, now + GAP_TTL_S)
            self.after = highest
        for i, until in list(self.gaps.items()):
            if until <= now:
                del self.gaps[i]
        if len(self.gaps) > MAX_GAPS:
            for i in sorted(self.gaps)[: len(self.gaps) - MAX_GAPS]:
                del self.gaps[i]


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
        self._local: dict[str, float] = {}  # report key -> when applied here
        self._recent: dict[str, float] = {}  # report key -> when read from the store
        self._pending: list[Observation] | None = None  # applied here during a full read
        self._measurements = RowCursor()
        self._failures = RowCursor()
        self._unread_local = False  # reports applied here that no read has met yet
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
        self._unsaved: tuple[SnapshotCover, int, bytes] | None = None  # made by a load
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
        if self._unread_local:
            self.catch_up()

    def apply_local(self, observations: Iterable[Observation]) -> bool:
        """This replica's own new evidence (already stored), applied at once."""
        now = time.monotonic()
        self._unread_local = True
        with self._apply_lock:
            fresh = [o for o in observations if not o.source or _key(o) not in self._recent]
            for o in fresh:
                if o.source:
                    self._local[_key(o)] = now
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
        """A reload that touches what changed, in place: the rows after this replica's
        cursors (an incremental read), and the failures of the window read again and
        put in place of those held (the only evidence a store change other than a new
        row alters: an admin's clear, also as an older release makes it, by moving
        ``evidence_epoch``), then expiry to the window. No index is rebuilt: a reload
        costs the failures and the new rows, not the window's pods.

        A failure applied here while the failures are read is kept unless the read
        has it, as a full load keeps one."""
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
                after = self.measurement_store.first_id(False, since) - 1
                through = self._measurements.after
                while after < through:  # wrong results already read, through their index
                    page = self.measurement_store.wrong_rows(since, after=after, through=through)
                    failures.extend(page.observations)
                    note.wrong_rows_read += len(page.ids)
                    if not page.more:
                        break
                    after = page.ids[-1]
                    let_the_loop_in()
                start = self.measurement_store.first_id(True, since) - 1
                cursor = RowCursor(start)
                seen = self._read_pages(True, since, start, failures.extend, keys)
                cursor.advance(seen, time.monotonic(), start=start, ordered=True)
                keys.update((_key(o), o.at) for o in failures if o.source)
                with self._apply_lock:
                    pending = [o for o in self._pending or [] if not o.ok]
                    failures.extend(o for o in pending if not o.source or _key(o) not in keys)
                    changed = self.trusted.replace_failures(failures) or changed
                    self._failures = cursor
                    self._clears = RowCursor(clears)
                    self._met(keys)
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
                cursor, note = self._read_into(loader, since, now, read_keys)
                start = self.measurement_store.first_id(True, since) - 1
                failures = RowCursor(start)
                seen = self._read_pages(True, since, start, loader.add, read_keys)
                failures.advance(seen, time.monotonic(), start=start, ordered=True)
                if note.snapshot_id is None or note.rows_read >= SNAPSHOT_ROWS:
                    self._unsaved = self._encode(loader, cursor)
                fresh.load(loader, let_the_loop_in)
                del loader
                with self._apply_lock:
                    pending = self._pending or []
                    fresh.add(o for o in pending if not o.source or _key(o) not in read_keys)
                    replaced = self.trusted.swap(fresh)
                    self._met(read_keys)
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

    # ------------------------------------------------------------- snapshots

    def _read_into(
        self,
        loader: EvidenceLoader,
        since: datetime,
        now: datetime,
        keys: dict[str, datetime | None],
    ) -> tuple[RowCursor, LoadNote]:
        """The window's measurements into ``loader``: the newest usable snapshot, the
        wrong results it covers (read again) and the rows after it; or, without one,
        every row of the window. The cursor of what was read, and how it went."""
        start = self.measurement_store.first_id(False, since) - 1
        note = LoadNote()
        snapshot = self._restore(loader, since, note)
        if snapshot is None:
            cursor = RowCursor(start)
            note.rows_read = self._load_measurements(loader, since, now, cursor, keys)
            return cursor, note
        through = snapshot.measurement_id
        after = start
        while after < through:  # the wrong results it covers, through their own index
            page = self.measurement_store.wrong_rows(since, after=after, through=through)
            loader.add(page.observations)
            keys.update((_key(o), o.at) for o in page.observations if o.source)
            note.wrong_rows_read += len(page.ids)
            if not page.more:
                break
            after = page.ids[-1]
            let_the_loop_in()
        cursor = RowCursor(max(start, through))
        gaps = [i for i in snapshot.gaps if i > start]
        if gaps:  # rows below it that were not visible when it was made
            again = self.measurement_store.measurement_rows(since, ids=gaps)
            loader.add(again.observations)
            note.rows_read += len(again.ids)
            missing = set(gaps) - set(again.ids)
            cursor.gaps = {i: time.monotonic() + GAP_TTL_S for i in sorted(missing)}
        note.rows_read += self._load_measurements(loader, since, now, cursor, keys)
        return cursor, note

    def _restore(
        self, loader: EvidenceLoader, since: datetime, note: LoadNote
    ) -> SnapshotCover | None:
        """The newest snapshot into ``loader`` (cut at ``since``) and what it covers;
        None, and why in ``note.fallback`` (logged), when there is none that reads."""
        if self.snapshots is None:
            note.fallback = "no snapshot store"
            return None
        stored = self.snapshots.latest()
        if stored is None:
            note.fallback = "no snapshot yet"
            return None
        try:
            groups = list(decode_snapshot(stored.payload, loader.per_pod, since.timestamp()))
        except SnapshotDamaged as exc:
            note.fallback = f"snapshot {stored.id} unusable: {exc}"
            log.warning("evidence: %s; reading the whole window", note.fallback)
            return None
        note.snapshot_id = stored.id
        note.pods_restored = loader.restore(groups)
        return stored.cover

    def _encode(
        self, loader: EvidenceLoader, cursor: RowCursor
    ) -> tuple[SnapshotCover, int, bytes] | None:
        """A snapshot of what ``loader`` read through ``cursor``; None when it cannot
        be kept (it is only a shortcut: the rows stay the truth)."""
        groups = list(loader.groups())
        try:
            payload = encode_snapshot(loader.per_pod, groups)
        except ValueError as exc:
            log.warning("evidence snapshot not made: %s", exc)
            return None
        pods = sum(len(records) for _, _, records in groups)
        return SnapshotCover(cursor.after, tuple(sorted(cursor.gaps))), pods, payload

    def save_snapshot(self) -> int | None:
        """Write the snapshot the last full load made, if any (off the start's path:
        the background thread's first tick); its id."""
        unsaved, self._unsaved = self._unsaved, None
        if unsaved is None or self.snapshots is None:
            return None
        cover, pods, payload = unsaved
        per_pod = self.trusted.all.per_pod
        return self.snapshots.save(self.clock(), per_pod, cover, pods, payload)

    def refresh_snapshot(self, *, force: bool = False) -> int | None:
        """A new snapshot from the newest one and the rows after it (read from the
        store, not from this replica's indexes, whose local reports may be ahead of
        any cursor), when ``SNAPSHOT_EVERY_S`` passed and ``SNAPSHOT_ROWS`` came
        since: so that the next start reads the recent rows only, whoever made the
        last one. Its id, None when none was due."""
        if self.snapshots is None:
            return None
        latest = self.snapshots.latest_made()
        now = self.clock()
        if not force and latest is not None:
            made_at, through = latest
            if (now - made_at).total_seconds() < SNAPSHOT_EVERY_S:
                return None
            if self.snapshots.rows_after(through) < SNAPSHOT_ROWS:
                return None
        loader = EvidenceLoader(self.trusted.all.per_pod)
        cursor, _ = self._read_into(loader, now - self.max_age, now, {})
        made = self._encode(loader, cursor)
        del loader
        if made is None:
            return None
        cover, pods, payload = made
        return self.snapshots.save(now, self.trusted.all.per_pod, cover, pods, payload)

    def catch_up(self) -> bool:
        """Read and apply only the rows this replica has not read (module docstring)."""
        with self._sync_lock:
            changed = self._catch_up()
        if changed:
            self.on_change()
        return changed

    def _catch_up(self) -> bool:
        """``catch_up``, the caller holding the sync lock (no ``on_change``)."""
        self._unread_local = False
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
            new = [o for o in read if not o.source or _key(o) not in self._local]
            self._met({_key(o): o.at for o in read if o.source})
            changed = self.trusted.add(new)
            self.trusted.note_read_through(self._measurements.after, self._failures.after)
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
            keys.update((_key(o), o.at) for o in page.observations if o.source)
            seen.extend(page.ids)
            if not page.more:
                return seen
            after = page.ids[-1]

    def _load_measurements(
        self,
        loader: EvidenceLoader,
        since: datetime,
        now: datetime,
        cursor: RowCursor,
        keys: dict[str, datetime | None],
    ) -> int:
        """A full reload's measurement rows above ``cursor``'s (how many), page by page into
        ``loader`` (lean rows: no observation each), each page's ids into ``cursor``
        (not all of them at the end: 650,000 ids held 23 MB). The report keys that
        ``_met`` and the pending reports need are noted for the few reports that can
        matter: stored in the last ``RECENT_S`` or applied here and not yet met (not
        every report of the window: 100,000 of them held 20 MB and seconds of CPU)."""
        recent = (now - timedelta(seconds=RECENT_S)).timestamp()
        after = cursor.after
        read = 0
        while True:
            page = self.measurement_store.measurement_rows(
                since, after=after, limit=RELOAD_PAGE, lean=True
            )
            with self._apply_lock:
                local = {k[2:] for k in self._local if k.startswith("m:")}
            samples = page.samples
            for i in range(0, len(samples), ADD_STEP):
                step = samples[i : i + ADD_STEP]
                loader.add_samples(step)
                for s in step:
                    if s[4] >= recent or s[7] in local:
                        keys["m:" + s[7]] = datetime.fromtimestamp(s[4], UTC)
                let_the_loop_in()
            loader.add(page.observations)
            keys.update((_key(o), o.at) for o in page.observations if o.source)
            cursor.advance(page.ids, time.monotonic(), start=after, ordered=True)
            read += len(page.ids)
            if not page.more:
                return read
            after = page.ids[-1]

    def _met(self, keys: Mapping[str, datetime | None]) -> None:
        """Reports a store read returned (report key -> stored at): no longer waiting
        to be met, and the recent ones remembered for a while in case this replica's
        route applies one late. Caller holds the apply lock."""
        now = time.monotonic()
        for key in [k for k in self._local if k in keys]:
            del self._local[key]
        recent = self.clock() - timedelta(seconds=RECENT_S)
        for key, at in keys.items():
            if at is None or at >= recent:
                self._recent[key] = now
        for table, ttl in ((self._recent, RECENT_S), (self._local, LOCAL_TTL_S)):
            stale = [k for k, at in table.items() if now - at > ttl]
            for k in stale:
                del table[k]


_KEYS = ("evidence_version", "evidence_epoch")


class _Reload:
    """One caller's request for a full reload, and how it went."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: Exception | None = None


def _key(o: Observation) -> str:
    return report_key(o.source)


def _backend(name: str | None) -> Backend | None:
    """A stored backend name as the registry's, None for one it does not know (any
    longer): a clear of it has nothing to forget here."""
    try:
        return None if name is None else Backend(name)
    except ValueError:
        return None
