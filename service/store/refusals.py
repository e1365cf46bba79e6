"""Refused selects: counts per (claimed cluster, reason, hour), added in small batches."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from mla_switchboard.service.store.base import aware
from mla_switchboard.service.store.models import RefusedSelectRow
from mla_switchboard.service.store.rows import RefusalCount
from sqlalchemy import Engine, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

KEEP = timedelta(days=7)


class RefusalStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert

    def add_refusals(self, counts: Mapping[tuple[str, str], int], at: datetime) -> None:
        """Add ``counts`` (per cluster and reason) to the hour of ``at``; forget hours
        older than a week (the dashboard shows the last hour, metrics keep the rest)."""
        hour = at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        rows = [
            {"cluster": c, "reason": r, "hour": hour, "count": n, "last_at": at}
            for (c, r), n in sorted(counts.items())
        ]
        if not rows:
            return
        t = RefusedSelectRow
        stmt = self._insert(t).values(rows)
        stmt = stmt.on_conflict_do_update(
            index_elements=["cluster", "reason", "hour"],
            set_={"count": t.count + stmt.excluded.count, "last_at": stmt.excluded.last_at},
        )
        with Session(self.engine) as s, s.begin():
            s.execute(stmt)
            s.execute(delete(t).where(t.hour < hour - KEEP))

    def refusals_since(self, since: datetime) -> list[RefusalCount]:
        """Refused selects per cluster and reason since ``since``, most refused first."""
        t = RefusedSelectRow
        since_hour = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        q = (
            select(
                t.cluster,
                t.reason,
                func.sum(t.count).label("refused"),
                func.max(t.last_at).label("last_at"),
            )
            .where(t.hour >= since_hour)
            .group_by(t.cluster, t.reason)
        )
        with Session(self.engine) as s:
            rows = [
                RefusalCount(r.cluster, r.reason, int(r.refused), aware(r.last_at))
                for r in s.execute(q)
            ]
        return sorted(rows, key=lambda r: (-r.refused, r.cluster, r.reason))
