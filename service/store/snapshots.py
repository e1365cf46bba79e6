"""Evidence snapshots: what a replica's evidence counted up to a measurement id, kept
so that a start (or a full reload) restores it and reads only the rows after it
(``service/evidence/sync.py``; the bytes are ``core.evidence.snapshot``'s)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from mla_switchboard.service.store.base import aware
from mla_switchboard.service.store.models import EvidenceSnapshotRow, MeasurementRow
from sqlalchemy import Engine, delete, func, insert, select

KEEP = 2
"""Snapshots kept: the newest, and the one before it while a replica may be reading it."""


@dataclass(frozen=True)
class SnapshotCover:
    """What a snapshot covers: every measurement id up to ``measurement_id`` except the
    ``gaps`` (ids below it that were not visible when it was made)."""

    measurement_id: int
    gaps: tuple[int, ...] = ()


@dataclass(frozen=True)
class StoredSnapshot:
    id: int
    made_at: datetime
    per_pod: int
    cover: SnapshotCover
    pods: int
    payload: bytes


@dataclass(eq=False)
class SnapshotStore:
    engine: Engine

    def latest(self) -> StoredSnapshot | None:
        """The newest snapshot, payload included (one row: a few bytes a pod)."""
        s = EvidenceSnapshotRow
        q = select(s).order_by(s.id.desc()).limit(1)
        with self.engine.connect() as conn:
            row = conn.execute(q).first()
        if row is None:
            return None
        return StoredSnapshot(
            row.id, aware(row.made_at), row.per_pod,
            SnapshotCover(int(row.measurement_id), tuple(int(i) for i in row.gaps or ())),
            row.pods, bytes(row.payload),
        )  # fmt: skip

    def latest_made(self) -> tuple[datetime, int] | None:
        """When the newest snapshot was made and the id it covers, without its payload."""
        s = EvidenceSnapshotRow
        q = select(s.made_at, s.measurement_id).order_by(s.id.desc()).limit(1)
        with self.engine.connect() as conn:
            row = conn.execute(q).first()
        return None if row is None else (aware(row[0]), int(row[1]))

    def save(
        self, made_at: datetime, per_pod: int, cover: SnapshotCover, pods: int, payload: bytes
    ) -> int:
        """Keep a new snapshot and drop all but the ``KEEP`` newest; its id."""
        s = EvidenceSnapshotRow
        with self.engine.begin() as conn:
            new = conn.execute(
                insert(s)
                .values(made_at=made_at, per_pod=per_pod, measurement_id=cover.measurement_id,
                        gaps=list(cover.gaps), pods=pods, payload=payload)
                .returning(s.id)
            ).scalar_one()  # fmt: skip
            kept = select(s.id).order_by(s.id.desc()).limit(KEEP).scalar_subquery()
            oldest_kept = select(func.min(s.id)).where(s.id.in_(kept)).scalar_subquery()
            conn.execute(delete(s).where(s.id < oldest_kept))
        return int(new)

    def rows_after(self, measurement_id: int) -> int:
        """How many measurement rows came after ``measurement_id`` (by id: an estimate
        of what a start from that snapshot reads, without counting them)."""
        with self.engine.connect() as conn:
            highest = conn.scalar(select(func.max(MeasurementRow.id))) or 0
        return max(0, int(highest) - measurement_id)
