"""Reading the evidence window into a bulk loader: from the newest snapshot and the
rows after it, or, without a usable one, every row of the window (``sync.py``'s module
docstring says when each happens); and which rows of a table a replica has read."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from mla_switchboard.core.evidence import EvidenceLoader, Observation
from mla_switchboard.core.evidence.snapshot import (
    SnapshotDamaged,
    decode_parts,
    encode_parts,
)
from mla_switchboard.service.evidence.ledger import RECENT_S, key_of
from mla_switchboard.service.priority import let_the_loop_in
from mla_switchboard.service.store.measurements import MeasurementStore
from mla_switchboard.service.store.snapshots import SnapshotCover, SnapshotStore

log = logging.getLogger("switchboard.evidence")

GAP_TTL_S = 60.0
"""How long an id below the high-water mark is asked for again before it is forgotten."""
MAX_GAPS = 1000
"""Most gaps remembered per table (the highest ids are kept)."""
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
class WindowReader:
    """One replica's reads of the evidence window into a bulk loader.
    ``local_reports``: the report ids applied here that no store read has met yet (a
    full read notes their keys, so that nothing counts twice)."""

    measurement_store: MeasurementStore
    snapshots: SnapshotStore | None
    local_reports: Callable[[], set[str]]

    def read_into(
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
            note.rows_read = self.load_measurements(loader, since, now, cursor, keys)
            return cursor, note
        through = snapshot.measurement_id
        note.wrong_rows_read = self.wrong_results(since, start, through, loader.add, keys)
        cursor = RowCursor(max(start, through))
        gaps = [i for i in snapshot.gaps if i > start]
        if gaps:  # rows below it that were not visible when it was made
            again = self.measurement_store.measurement_rows(since, ids=gaps)
            loader.add(again.observations)
            note.rows_read += len(again.ids)
            missing = set(gaps) - set(again.ids)
            cursor.gaps = {i: time.monotonic() + GAP_TTL_S for i in sorted(missing)}
        note.rows_read += self.load_measurements(loader, since, now, cursor, keys)
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
        if stored.parts:  # a part at a time, straight into the loader
            parts: Iterable[bytes] = self.snapshots.parts_of(stored.id)
            count = stored.parts
        else:  # one payload, as snapshots were kept before parts
            parts, count = [self.snapshots.payload(stored.id)], 1
        try:
            groups = decode_parts(parts, count, loader.per_pod, since.timestamp())
            del parts
            note.pods_restored = loader.restore(groups)
        except SnapshotDamaged as exc:
            loader.clear()
            note.pods_restored = 0
            note.fallback = f"snapshot {stored.id} unusable: {exc}"
            log.warning("evidence: %s; reading the whole window", note.fallback)
            return None
        note.snapshot_id = stored.id
        return stored.cover

    def wrong_results(
        self,
        since: datetime,
        after: int,
        through: int,
        sink: Callable[[list[Observation]], object],
        keys: dict[str, datetime | None],
    ) -> int:
        """The wrong results with ids in (``after``, ``through``], through their own
        index, page by page into ``sink`` (their report keys into ``keys``); the rows
        read."""
        read = 0
        while after < through:
            page = self.measurement_store.wrong_rows(since, after=after, through=through)
            sink(page.observations)
            keys.update((key_of(o), o.at) for o in page.observations if o.source)
            read += len(page.ids)
            if not page.more:
                break
            after = page.ids[-1]
            let_the_loop_in()
        return read

    def encode(
        self, loader: EvidenceLoader, cursor: RowCursor
    ) -> tuple[SnapshotCover, int, list[bytes]] | None:
        """A snapshot of what ``loader`` read through ``cursor``, in parts; None when
        it cannot be kept (it is only a shortcut: the rows stay the truth)."""
        groups = list(loader.groups())
        try:
            parts = list(encode_parts(loader.per_pod, groups))
        except ValueError as exc:
            log.warning("evidence snapshot not made: %s", exc)
            return None
        pods = sum(len(records) for _, _, records in groups)
        return SnapshotCover(cursor.after, tuple(sorted(cursor.gaps))), pods, parts

    def load_measurements(
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
            local = self.local_reports()
            samples = page.samples
            for i in range(0, len(samples), ADD_STEP):
                step = samples[i : i + ADD_STEP]
                loader.add_samples(step)
                for s in step:
                    if s[4] >= recent or s[7] in local:
                        keys["m:" + s[7]] = datetime.fromtimestamp(s[4], UTC)
                let_the_loop_in()
            loader.add(page.observations)
            keys.update((key_of(o), o.at) for o in page.observations if o.source)
            cursor.advance(page.ids, time.monotonic(), start=after, ordered=True)
            read += len(page.ids)
            if not page.more:
                return read
            after = page.ids[-1]

    def refresh(
        self, now: datetime, max_age: timedelta, per_pod: int, *, force: bool = False
    ) -> int | None:
        """A new snapshot from the newest one and the rows after it (read from the
        store, not from a replica's indexes, whose local reports may be ahead of any
        cursor), when ``SNAPSHOT_EVERY_S`` passed and ``SNAPSHOT_ROWS`` came since (or
        ``force``): so that the next start reads the recent rows only, whoever made
        the last one. Its id, None when none was due."""
        if self.snapshots is None:
            return None
        latest = self.snapshots.latest_made()
        if not force and latest is not None:
            made_at, through = latest
            if (now - made_at).total_seconds() < SNAPSHOT_EVERY_S:
                return None
            if self.snapshots.rows_after(through) < SNAPSHOT_ROWS:
                return None
        loader = EvidenceLoader(per_pod)
        cursor, _ = self.read_into(loader, now - max_age, now, {})
        made = self.encode(loader, cursor)
        del loader
        if made is None:
            return None
        cover, pods, parts = made
        return self.snapshots.save(now, per_pod, cover, pods, parts)
