"""Evidence snapshots: what a replica's evidence counted up to a measurement id, kept
so that a start (or a full reload) restores it and reads only the rows after it
(``service/evidence/sync.py``; the bytes are ``core.evidence.snapshot``'s). A snapshot
is kept in parts of a few hundred KB, one row each, written and read one at a time:
never a block the size of the whole in this process or in the driver."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from mla_switchboard.service.store.base import aware
from mla_switchboard.service.store.models import (
    EvidenceSnapshotPartRow,
    EvidenceSnapshotRow,
    MeasurementRow,
)
from sqlalchemy import Engine, delete, func, insert, select, update

KEEP = 2
"""Snapshots kept: the newest, and the one before it while a replica may be reading it."""
PARTS_PER_QUERY = 4
"""Parts fetched by one query (about a MB): few round trips, no large driver buffer."""
PARTS_PER_INSERT = 4
"""Parts written by one statement, for the same reason."""


@dataclass(frozen=True)
class SnapshotCover:
    """What a snapshot covers: every measurement id up to ``measurement_id`` except the
    ``gaps`` (ids below it that were not visible when it was made)."""

    measurement_id: int
    gaps: tuple[int, ...] = ()


@dataclass(frozen=True)
class StoredSnapshot:
    """A snapshot's row without its bytes. ``parts``: how many part rows hold them (0:
    a snapshot of the one-payload layout, :meth:`SnapshotStore.payload`)."""

    id: int
    made_at: datetime
    per_pod: int
    cover: SnapshotCover
    pods: int
    parts: int


@dataclass(eq=False)
class SnapshotStore:
    engine: Engine

    def latest(self) -> StoredSnapshot | None:
        """The newest snapshot, without its bytes (:meth:`parts_of`, :meth:`payload`)."""
        s = EvidenceSnapshotRow
        q = select(s.id, s.made_at, s.per_pod, s.measurement_id, s.gaps, s.pods, s.parts)
        with self.engine.connect() as conn:
            row = conn.execute(q.order_by(s.id.desc()).limit(1)).first()
        if row is None:
            return None
        return StoredSnapshot(
            row.id, aware(row.made_at), row.per_pod,
            SnapshotCover(int(row.measurement_id), tuple(int(i) for i in row.gaps or ())),
            row.pods, int(row.parts or 0),
        )  # fmt: skip

    def payload(self, snapshot_id: int) -> bytes:
        """The bytes of a snapshot kept in one payload (the layout before parts)."""
        s = EvidenceSnapshotRow
        with self.engine.connect() as conn:
            found = conn.scalar(select(s.payload).where(s.id == snapshot_id))
        return b"" if found is None else bytes(found)

    def parts_of(self, snapshot_id: int) -> Iterator[bytes]:
        """A snapshot's parts in order, ``PARTS_PER_QUERY`` fetched at a time (on one
        connection), so that only those few are held while the caller decodes one."""
        p = EvidenceSnapshotPartRow
        after = -1
        with self.engine.connect() as conn:
            while True:
                q = (
                    select(p.seq, p.payload)
                    .where(p.snapshot_id == snapshot_id, p.seq > after)
                    .order_by(p.seq)
                    .limit(PARTS_PER_QUERY)
                )
                rows = conn.execute(q).all()
                if not rows:
                    return
                after, last = int(rows[-1][0]), len(rows) < PARTS_PER_QUERY
                page = [bytes(payload) for _, payload in rows]
                del rows
                while page:
                    yield page.pop(0)  # not held here once the caller moves on
                if last:
                    return

    def latest_made(self) -> tuple[datetime, int] | None:
        """When the newest snapshot was made and the id it covers, without its payload."""
        s = EvidenceSnapshotRow
        q = select(s.made_at, s.measurement_id).order_by(s.id.desc()).limit(1)
        with self.engine.connect() as conn:
            row = conn.execute(q).first()
        return None if row is None else (aware(row[0]), int(row[1]))

    def save(
        self,
        made_at: datetime,
        per_pod: int,
        cover: SnapshotCover,
        pods: int,
        parts: Iterable[bytes],
    ) -> int:
        """Keep a new snapshot, its ``parts`` written a few at a time as they come, and
        drop all but the ``KEEP`` newest (with their parts), in one transaction: a
        reader sees the whole snapshot or none of it. Its id."""
        s, p = EvidenceSnapshotRow, EvidenceSnapshotPartRow
        with self.engine.begin() as conn:
            new = conn.execute(
                insert(s)
                .values(made_at=made_at, per_pod=per_pod, measurement_id=cover.measurement_id,
                        gaps=list(cover.gaps), pods=pods, payload=b"", parts=0)
                .returning(s.id)
            ).scalar_one()  # fmt: skip
            conn.execute(delete(p).where(p.snapshot_id == new))  # a reused id's leftovers
            count = 0
            batch: list[dict[str, object]] = []
            for part in parts:
                batch.append({"snapshot_id": new, "seq": count, "payload": part})
                count += 1
                if len(batch) >= PARTS_PER_INSERT:
                    conn.execute(insert(p), batch)
                    batch = []
            if batch:
                conn.execute(insert(p), batch)
            conn.execute(update(s).where(s.id == new).values(parts=count))
            kept = select(s.id).order_by(s.id.desc()).limit(KEEP).scalar_subquery()
            oldest_kept = conn.scalar(select(func.min(s.id)).where(s.id.in_(kept)))
            conn.execute(delete(s).where(s.id < oldest_kept))
            conn.execute(delete(p).where(p.snapshot_id < oldest_kept))
        return int(new)

    def rows_after(self, measurement_id: int) -> int:
        """How many measurement rows came after ``measurement_id`` (by id: an estimate
        of what a start from that snapshot reads, without counting them)."""
        with self.engine.connect() as conn:
            highest = conn.scalar(select(func.max(MeasurementRow.id))) or 0
        return max(0, int(highest) - measurement_id)
