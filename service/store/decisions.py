"""Recorded decisions: batch inserts from the recorder, listings, each pod's latest."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.service.state import DecisionRecord, PodState
from mla_switchboard.service.store.base import aware
from mla_switchboard.service.store.models import AnswerRow, DecisionRow, PodLatest
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.orm import Session

_POD_LATEST_CONFLICT = (
    "ON CONFLICT (cluster, node, pod) DO UPDATE SET "
    "decision_id = excluded.decision_id, backend = excluded.backend, "
    "source = excluded.source, created_at = excluded.created_at, "
    "answer_id = excluded.answer_id "
    "WHERE excluded.decision_id > pod_latest.decision_id"
)

# One round trip after the COPY: the staged batch into decisions (known ids skipped),
# then each named pod's newest decision of the batch into pod_latest, in key order
# (replicas writing overlapping pods lock them in the same order: no deadlock).
_PG_FROM_STAGE = (
    "INSERT INTO decisions (id, created_at, cluster, node, pod, backend, source, "
    "rules_revision, request, answer_id) SELECT id, created_at, cluster, node, pod, backend, "
    "source, rules_revision, request, answer_id FROM sb_stage ON CONFLICT (id) DO NOTHING; "
    "INSERT INTO pod_latest (cluster, node, pod, decision_id, backend, source, created_at, "
    "answer_id) SELECT DISTINCT ON (cluster, coalesce(node, ''), pod) cluster, "
    "coalesce(node, ''), pod, id, backend, source, created_at, answer_id FROM sb_stage "
    "WHERE pod IS NOT NULL ORDER BY cluster, coalesce(node, ''), pod, id DESC "
    f"{_POD_LATEST_CONFLICT}"
)


# Rows per SQLite statement: 64 x 10 parameters stays under SQLite's oldest limit
# of 999 parameters per statement.
SQLITE_ROWS = 64


def _flat(rows: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    return tuple(itertools.chain.from_iterable(rows))


def rows_of(records: Iterable[DecisionRecord]) -> list[tuple[Any, ...]]:
    """``DecisionRecord`` values as the writer's rows (same field order)."""
    return [
        (
            d.id,
            d.created_at,
            d.cluster,
            d.node,
            d.pod,
            d.backend,
            d.source,
            d.rules_revision,
            d.request_json,
            d.answer_id,
            d.answer_json,
        )
        for d in records
    ]


def _decision(r: DecisionRow, answer_json: str | None = None) -> DecisionRecord:
    return DecisionRecord(
        id=r.id,
        created_at=aware(r.created_at),
        cluster=r.cluster,
        node=r.node,
        pod=r.pod,
        backend=r.backend,
        source=r.source,
        rules_revision=r.rules_revision,
        request_json=r.request,
        answer_id=r.answer_id,
        answer_json=answer_json,
    )


class DecisionStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._known_answers: set[str] = set()
        self._sql: dict[Any, str] = self._prepare_sql()  # type: ignore[assignment]
        if engine.dialect.name == "sqlite":
            # SQLAlchemy's own SQLite DateTime text format, naive UTC
            self._timestamp: Callable[[datetime], Any] = lambda d: (
                d.astimezone(UTC).replace(tzinfo=None).isoformat(" ")
            )
        else:
            self._timestamp = lambda d: d

    def record_decisions(self, batch: Sequence[DecisionRecord]) -> None:
        """Insert a batch of ``DecisionRecord`` values (see ``record_rows``)."""
        self.record_rows(rows_of(batch))

    def record_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert a batch, its new answers, and move each pod's latest pointer, in one
        transaction. Rows are plain tuples in ``DecisionRecord``'s field order, the
        request already JSON text.

        This bypasses SQLAlchemy's statement compiler, and keeps the number of calls
        into the driver per batch small and fixed: every call releases the GIL, and on
        a replica at full load getting it back costs up to the interpreter's switch
        interval (5 ms), so per-row calls made the writer slower than the service it
        records (issue 13). PostgreSQL: one ``COPY`` into a temporary staging table,
        then one round trip of ``INSERT ... SELECT`` (decisions, each pod's newest) in
        the same transaction. SQLite: ``executemany`` in one transaction (a C loop).
        Inserts skip known ids (``ON CONFLICT DO NOTHING``): a batch whose commit went
        through unacknowledged, or a replayed spill file, is harmless.
        """
        if not rows:
            return
        answers: dict[str, str] = {}
        known = self._known_answers
        for r in rows:
            if r[9] not in known and r[10] is not None:
                answers[r[9]] = r[10]
        with self.engine.begin() as conn:
            if answers:
                # sorted, like pod_latest below: replicas writing overlapping rows in
                # the same order cannot deadlock each other on PostgreSQL
                conn.exec_driver_sql(self._sql["answers"], sorted(answers.items()))
            if self.engine.dialect.name == "postgresql":
                self._copy_postgres(conn, rows)
            else:
                self._insert_sqlite(conn, rows)
        known.update(answers)

    def _insert_sqlite(self, conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        ts = self._timestamp
        self._sqlite_rows(conn, "decisions", [(r[0], ts(r[1]), *r[2:10]) for r in rows])
        latest: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        for r in rows:
            if r[4] is None:
                continue  # an unnamed pod cannot be counted as one pod
            key = (r[2], r[3] or "", r[4])
            if key not in latest or latest[key][0] < r[0]:
                latest[key] = r
        if latest:
            self._sqlite_rows(
                conn,
                "pod_latest",
                [
                    (c, n, p, r[0], r[5], r[6], ts(r[1]), r[9])
                    for (c, n, p), r in sorted(latest.items())
                ],
            )

    def _sqlite_rows(self, conn: Connection, name: str, params: list[tuple[Any, ...]]) -> None:
        """Insert ``params`` with statement ``name``, up to ``SQLITE_ROWS`` rows per
        statement.

        Python's sqlite3 releases the GIL around every step of every statement, even
        inside ``executemany``; while the event loop is busy, taking the GIL back waits
        up to the switch interval each time, so one row per step held the writer to
        about a thousand rows a second under full load (its backlog then made every
        full garbage collection longer). A statement of many rows is one step. Sizes
        are powers of two, so that a few statements, prepared once, fit any batch.
        """
        done = len(params) - len(params) % SQLITE_ROWS
        if done:
            conn.exec_driver_sql(
                self._sqlite_sql(name, SQLITE_ROWS),
                [_flat(params[i : i + SQLITE_ROWS]) for i in range(0, done, SQLITE_ROWS)],
            )
        size = SQLITE_ROWS // 2
        while done < len(params):
            if len(params) - done >= size:
                conn.exec_driver_sql(
                    self._sqlite_sql(name, size), _flat(params[done : done + size])
                )
                done += size
            size //= 2

    def _sqlite_sql(self, name: str, rows: int) -> str:
        sql = self._sql.get((name, rows))
        if sql is None:
            head, _, rest = self._sql[name].partition(" VALUES ")
            group, _, tail = rest.partition(")")  # the one row's "(?, ..., ?" and the rest
            sql = f"{head} VALUES {', '.join([group + ')'] * rows)}{tail}"
            self._sql[(name, rows)] = sql
        return sql

    def _copy_postgres(self, conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        info = conn.connection.info
        with dbapi.cursor() as cur:
            if not info.get("sb_stage"):
                cur.execute(
                    "CREATE TEMPORARY TABLE IF NOT EXISTS sb_stage (id text, created_at "
                    "timestamptz, cluster text, node text, pod text, backend text, source text, "
                    "rules_revision integer, request text, answer_id text) "
                    "ON COMMIT DELETE ROWS"
                )
                info["sb_stage"] = True
            with cur.copy(
                "COPY sb_stage (id, created_at, cluster, node, pod, backend, source, "
                "rules_revision, request, answer_id) FROM STDIN"
            ) as copy:
                for r in rows:
                    copy.write_row(r[:10])
            cur.execute(_PG_FROM_STAGE)

    def _prepare_sql(self) -> dict[str, str]:
        mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"

        def values(n: int) -> str:
            return "(" + ", ".join([mark] * n) + ")"

        return {
            "answers": f"INSERT INTO answers (id, answer) VALUES {values(2)} "
            "ON CONFLICT (id) DO NOTHING",
            "decisions": "INSERT INTO decisions (id, created_at, cluster, node, pod, backend, "
            f"source, rules_revision, request, answer_id) VALUES {values(10)} "
            "ON CONFLICT (id) DO NOTHING",
            "pod_latest": "INSERT INTO pod_latest (cluster, node, pod, decision_id, backend, "
            f"source, created_at, answer_id) VALUES {values(8)} "
            f"{_POD_LATEST_CONFLICT}",
        }

    def count_decisions(self) -> int:
        with Session(self.engine) as s:
            return s.scalar(select(func.count()).select_from(DecisionRow)) or 0

    def list_decisions(
        self,
        *,
        cluster: str | None,
        backend: str | None,
        pod: str | None = None,
        limit: int,
        before_id: str | None,
    ) -> list[DecisionRecord]:
        q = select(DecisionRow).order_by(DecisionRow.id.desc()).limit(limit)
        if cluster is not None:
            q = q.where(DecisionRow.cluster == cluster)
        if backend is not None:
            q = q.where(DecisionRow.backend == backend)
        if pod is not None:
            q = q.where(DecisionRow.pod == pod)
        if before_id is not None:
            q = q.where(DecisionRow.id < before_id)
        with Session(self.engine) as s:
            return [_decision(r) for r in s.scalars(q)]

    def get_decision(self, decision_id: str) -> DecisionRecord | None:
        with Session(self.engine) as s:
            row = s.get(DecisionRow, decision_id)
            if row is None:
                return None
            answer = s.get(AnswerRow, row.answer_id)
            return _decision(row, None if answer is None else answer.answer)

    def summary(self) -> dict[str, dict[str, int]]:
        q = select(PodLatest.cluster, PodLatest.backend, func.count()).group_by(
            PodLatest.cluster, PodLatest.backend
        )
        out: dict[str, dict[str, int]] = {}
        with Session(self.engine) as s:
            for cluster, backend, n in s.execute(q):
                out.setdefault(cluster, {})[backend] = n
        return {c: dict(sorted(b.items())) for c, b in sorted(out.items())}

    def latest_per_pod(self) -> list[PodState]:
        """Every named pod's newest decision, with the request it sent (for replay)."""
        q = select(
            PodLatest.cluster,
            PodLatest.node,
            PodLatest.pod,
            PodLatest.decision_id,
            PodLatest.backend,
            PodLatest.source,
            DecisionRow.request,
        ).join(DecisionRow, DecisionRow.id == PodLatest.decision_id)
        with self.engine.connect() as conn:
            return [PodState(*row) for row in conn.execute(q)]
