"""Recorded decisions: batch inserts from the recorder, listings, and the fleet's counts.

Three tables move together in each batch's transaction: ``decisions`` (the log),
``pod_latest`` (each named pod's newest decision, with its stage bucket) and
``fleet_counts`` (how many pods' newest decision is in each (cluster, shape, backend,
source) group, per stage bucket). The counts are what every fleet read uses, so
those reads cost O(clusters x situations) however many pods there are; keeping them
exact needs the old and the new group of every pod a batch moves, which is why the
pod_latest part of a batch runs under one lock across replicas (a PostgreSQL
advisory lock per schema, SQLite's write lock).
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core.names import cluster_matches
from mla_switchboard.core.schemas import SelectRequest
from mla_switchboard.core.stages import STAGE_BUCKETS, stage_bucket
from mla_switchboard.service.fleet.shapes import Shape, request_from_shape, shape_of_json
from mla_switchboard.service.state import DecisionRecord, PodState
from mla_switchboard.service.store.base import aware
from mla_switchboard.service.store.models import (
    AnswerRow,
    DecisionRow,
    FleetCount,
    Meta,
    PodLatest,
    ShapeRow,
)
from sqlalchemy import Connection, Engine, delete, func, or_, select, tuple_
from sqlalchemy.orm import Session

Row = tuple[Any, ...]
"""One decision as the writer takes it: ``(id, created_at, cluster, node, pod, backend,
source, rules_revision, shape_id, answer_id, shape_json, answer_json)``. The two JSON
texts are shared by every decision of one shape or answer and stored once each."""

ROW_FIELDS = 12
SQLITE_ROWS = 64
"""Rows per SQLite statement (see ``DecisionStore._sqlite_rows``)."""
KNOWN_LIMIT = 100_000
"""Shape and answer ids a writer remembers having stored (memory stays bounded)."""


def decision_row(
    decision_id: str,
    created_at: datetime,
    request: SelectRequest,
    backend: str,
    source: str,
    rules_revision: int,
    shape: Shape,
    answer_id: str,
    answer_json: str,
) -> Row:
    """The row ``/v1/select`` hands the recorder (``shape``: ``shape_of(request)``, which
    the selector computed once for every pod of that shape)."""
    return (
        decision_id,
        created_at,
        request.cluster,
        request.node,
        request.pod,
        backend,
        source,
        rules_revision,
        shape.id,
        answer_id,
        shape.json,
        answer_json,
    )


def rows_of(records: Iterable[DecisionRecord]) -> list[Row]:
    """``DecisionRecord`` values (a whole request as JSON text) as the writer's rows."""
    out = []
    for d in records:
        shape = shape_of_json(d.request_json)
        out.append(
            (
                d.id,
                d.created_at,
                d.cluster,
                d.node,
                d.pod,
                d.backend,
                d.source,
                d.rules_revision,
                shape.id,
                d.answer_id,
                shape.json,
                d.answer_json,
            )
        )
    return out


@dataclass(frozen=True)
class LivePod:
    """One pod of the live fleet: its newest decision, when it was made, its shape."""

    cluster: str
    node: str
    pod: str
    decision_id: str
    backend: str
    source: str
    seen_at: datetime
    shape_id: str | None
    bucket: int | None


@dataclass(frozen=True)
class PodFilter:
    """What ``list_pods`` selects; every field narrows (None: no condition). Cluster
    globs use the token rule (``*`` and ``?`` over [a-z0-9._-]), so a token's scope is
    a filter the database applies, not a scan."""

    cluster_globs: tuple[str, ...] | None = None
    backends: tuple[str, ...] | None = None
    sources: tuple[str, ...] | None = None
    shape_ids: tuple[str, ...] | None = None
    buckets: tuple[int, ...] | None = None
    prefix: str | None = None  # of the pod's or the node's name

    def pods_in(self, row: FleetGroup) -> int:
        """How many pods of one fleet-count row this filter keeps: the conditions
        ``list_pods`` gives the database, on the counts (``prefix`` aside), so that a
        page and the facet counts beside it can never disagree."""
        if self.cluster_globs is not None and not cluster_matches(row.cluster, self.cluster_globs):
            return 0
        if self.shape_ids is not None and row.shape_id not in self.shape_ids:
            return 0
        if self.backends is not None and row.backend not in self.backends:
            return 0
        if self.sources is not None and row.source not in self.sources:
            return 0
        if self.buckets is None:
            return row.pods
        return sum(row.buckets[b] for b in self.buckets if b < len(row.buckets))


@dataclass(frozen=True)
class FleetGroup:
    """Pods whose newest decision is in one (cluster, shape, backend, source) group;
    ``buckets[b]`` of them are in stage bucket ``b``."""

    cluster: str
    shape_id: str
    backend: str
    source: str
    pods: int
    buckets: tuple[int, ...]


_POD_LATEST_CONFLICT = (
    "ON CONFLICT (cluster, node, pod) DO UPDATE SET "
    "decision_id = excluded.decision_id, backend = excluded.backend, "
    "source = excluded.source, created_at = excluded.created_at, "
    "answer_id = excluded.answer_id, shape_id = excluded.shape_id, bucket = excluded.bucket "
    "WHERE excluded.decision_id > pod_latest.decision_id"
)

_STAGE_COLUMNS = (
    "id, created_at, cluster, node, pod, backend, source, rules_revision, shape_id, "
    "answer_id, bucket"
)
_PG_DECISIONS_FROM_STAGE = (
    "INSERT INTO decisions (id, created_at, cluster, node, pod, backend, source, "
    "rules_revision, shape_id, answer_id) SELECT id, created_at, cluster, node, pod, "
    "backend, source, rules_revision, shape_id, answer_id FROM sb_stage "
    "ON CONFLICT (id) DO NOTHING"
)
# each named pod's newest decision of the batch, in key order
_PG_POD_LATEST_FROM_STAGE = (
    "INSERT INTO pod_latest (cluster, node, pod, decision_id, backend, source, created_at, "
    "answer_id, shape_id, bucket) SELECT DISTINCT ON (cluster, coalesce(node, ''), pod) "
    "cluster, coalesce(node, ''), pod, id, backend, source, created_at, answer_id, shape_id, "
    "bucket FROM sb_stage WHERE pod <> '' "
    "ORDER BY cluster, coalesce(node, ''), pod, id DESC "
    f"{_POD_LATEST_CONFLICT}"
)
_PG_OLD_LATEST = (
    "SELECT p.cluster, p.node, p.pod, p.decision_id, p.shape_id, p.backend, p.source, "
    "p.bucket FROM pod_latest p JOIN (SELECT DISTINCT cluster, coalesce(node, '') AS node, pod "
    "FROM sb_stage WHERE pod <> '') s "
    "ON p.cluster = s.cluster AND p.node = s.node AND p.pod = s.pod"
)
# One writer at a time moves pods between groups, per schema (the tests and several
# services share one PostgreSQL database in different schemas).
_PG_FLEET_LOCK = "SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':fleet_counts'))"

_STAGE_READY = "sb_stage_v2"
"""Set in a connection's ``info`` once its temporary staging table exists."""

PodKey = tuple[str, str, str]
GroupKey = tuple[str, str, str, str]


class DecisionStore:
    def __init__(self, engine: Engine, *, writer: Engine | None = None) -> None:
        self.engine = engine
        # the batches' own engine: shorter lock and statement waits, a pool of its own
        self._writer = writer or engine
        self._known_answers: set[str] = set()
        self._known_shapes: set[str] = set()
        self._shapes: dict[str, str] = {}  # id -> JSON, read back once (immutable)
        self._bumped = 0
        # the fleet_version this writer's last committed batch made (0: none yet)
        self.fleet_version_written = 0
        self._postgres = engine.dialect.name == "postgresql"
        self._sql = self._prepare_sql()
        if engine.dialect.name == "sqlite":
            # SQLAlchemy's own SQLite DateTime text format, naive UTC
            self._timestamp: Callable[[datetime], Any] = lambda d: (
                d.astimezone(UTC).replace(tzinfo=None).isoformat(" ")
            )
        else:
            self._timestamp = lambda d: d

    # ------------------------------------------------------------------- writes
    def record_decisions(self, batch: Sequence[DecisionRecord]) -> None:
        """Insert a batch of ``DecisionRecord`` values (see ``record_rows``)."""
        self.record_rows(rows_of(batch))

    def record_rows(self, rows: Sequence[Row]) -> None:
        """Insert a batch, its new shapes and answers, move each pod's newest pointer and
        the fleet's counts, in one transaction.

        This bypasses SQLAlchemy's statement compiler and keeps the number of calls into
        the driver per batch small and fixed: every call releases the GIL, and on a
        replica at full load getting it back costs up to the interpreter's switch
        interval, so per-row calls made the writer slower than the service it records.
        PostgreSQL: one ``COPY`` into a temporary staging table, then set-based
        statements from it. SQLite: ``executemany`` (a C loop). Inserts skip known ids
        (``ON CONFLICT DO NOTHING``): a batch whose commit went through unacknowledged,
        or a replayed spill file, is harmless, and so is its fleet part, which only moves
        pods whose stored newest decision is older than the batch's.
        """
        if not rows:
            return
        shapes = {r[8]: r[10] for r in rows if r[8] not in self._known_shapes}
        answers = {
            r[9]: r[11] for r in rows if r[9] not in self._known_answers and r[11] is not None
        }
        newest = _newest_per_pod(rows)
        self._bumped = 0
        info: dict[Any, Any] | None = None
        try:
            with self._writer.begin() as conn:
                info = conn.connection.info
                if not self._postgres:
                    # the write lock now, so the pod_latest read below is what is committed
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                if shapes:
                    # sorted: replicas writing overlapping rows in the same order cannot
                    # deadlock each other on PostgreSQL
                    conn.exec_driver_sql(self._sql["shapes"], sorted(shapes.items()))
                if answers:
                    conn.exec_driver_sql(self._sql["answers"], sorted(answers.items()))
                if self._postgres:
                    self._copy_postgres(conn, rows, newest)
                else:
                    self._insert_sqlite(conn, rows, newest)
        except BaseException:
            # A staging table created in this transaction went with its rollback, and
            # the connection (still good after a refused row or a lock timeout) would
            # otherwise fail every later batch on "sb_stage does not exist".
            if info is not None:
                info.pop(_STAGE_READY, None)
            raise
        if self._bumped:
            self.fleet_version_written = max(self.fleet_version_written, self._bumped)
        for known, new in ((self._known_shapes, shapes), (self._known_answers, answers)):
            if len(known) > KNOWN_LIMIT:
                known.clear()  # forgetting costs one harmless ON CONFLICT DO NOTHING each
            known.update(new)

    def _insert_sqlite(
        self, conn: Connection, rows: Sequence[Row], newest: dict[PodKey, Row]
    ) -> None:
        ts = self._timestamp
        self._sqlite_rows(conn, "decisions", [(r[0], ts(r[1]), *r[2:10]) for r in rows])
        if not newest:
            return
        old = self._old_latest_sqlite(conn, list(newest))
        moved = self._move(conn, newest, old)
        if moved:
            self._sqlite_rows(
                conn,
                "pod_latest",
                [
                    (c, n, p, r[0], r[5], r[6], ts(r[1]), r[9], r[8], stage_bucket(c, p))
                    for (c, n, p), r in sorted(moved.items())
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
        key = f"{name}*{rows}"
        sql = self._sql.get(key)
        if sql is None:
            head, _, rest = self._sql[name].partition(" VALUES ")
            group, _, tail = rest.partition(")")  # the one row's "(?, ..., ?" and the rest
            sql = f"{head} VALUES {', '.join([group + ')'] * rows)}{tail}"
            self._sql[key] = sql
        return sql

    def _old_latest_sqlite(self, conn: Connection, keys: list[PodKey]) -> dict[PodKey, Row]:
        out: dict[PodKey, Row] = {}
        for i in range(0, len(keys), 300):
            chunk = keys[i : i + 300]
            marks = ", ".join(["(?, ?, ?)"] * len(chunk))
            result = conn.exec_driver_sql(
                "SELECT cluster, node, pod, decision_id, shape_id, backend, source, bucket "
                f"FROM pod_latest WHERE (cluster, node, pod) IN (VALUES {marks})",
                tuple(v for key in chunk for v in key),
            )
            for row in result:
                out[(row[0], row[1], row[2])] = tuple(row)
        return out

    def _copy_postgres(
        self, conn: Connection, rows: Sequence[Row], newest: dict[PodKey, Row]
    ) -> None:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        info = conn.connection.info
        with dbapi.cursor() as cur:
            if not info.get(_STAGE_READY):
                cur.execute("DROP TABLE IF EXISTS sb_stage")
                cur.execute(
                    "CREATE TEMPORARY TABLE sb_stage (id text, created_at timestamptz, "
                    "cluster text, node text, pod text, backend text, source text, "
                    "rules_revision integer, shape_id text, answer_id text, bucket integer) "
                    "ON COMMIT DELETE ROWS"
                )
                info[_STAGE_READY] = True
            with cur.copy(f"COPY sb_stage ({_STAGE_COLUMNS}) FROM STDIN") as copy:
                for r in rows:
                    copy.write_row((*r[:10], stage_bucket(r[2], r[4])))
            cur.execute(_PG_DECISIONS_FROM_STAGE)
            if not newest:
                return
            cur.execute(_PG_FLEET_LOCK)
            cur.execute(_PG_OLD_LATEST)
            old = {(r[0], r[1], r[2]): tuple(r) for r in cur.fetchall()}
        if self._move(conn, newest, old):
            conn.exec_driver_sql(_PG_POD_LATEST_FROM_STAGE)

    def _move(
        self, conn: Connection, newest: dict[PodKey, Row], old: dict[PodKey, Row]
    ) -> dict[PodKey, Row]:
        """Apply to ``fleet_counts`` what the batch's newest decisions do to each pod's
        group; returns the pods that move (their stored decision is older)."""
        moved: dict[PodKey, Row] = {}
        delta: dict[GroupKey, list[int]] = defaultdict(lambda: [0] * STAGE_BUCKETS)
        for key, r in newest.items():
            before = old.get(key)
            if before is not None and before[3] >= r[0]:
                continue  # the store holds a newer decision of this pod
            moved[key] = r
            cluster, _, pod = key
            bucket = stage_bucket(cluster, pod)
            assert bucket is not None  # only named pods are counted
            if before is not None and before[4] is not None:
                was = before[7] if before[7] is not None else bucket
                delta[(cluster, before[4], before[5], before[6])][was] -= 1
            delta[(cluster, r[8], r[5], r[6])][bucket] += 1
        changed = {k: v for k, v in delta.items() if any(v)}
        if changed:
            self._apply_counts(conn, changed)
        return moved

    def _apply_counts(self, conn: Connection, delta: dict[GroupKey, list[int]]) -> None:
        mark = "?" if not self._postgres else "%s"
        keys = sorted(delta)
        current: dict[GroupKey, list[int]] = {}
        for i in range(0, len(keys), 200):
            chunk = keys[i : i + 200]
            values = ", ".join([f"({mark}, {mark}, {mark}, {mark})"] * len(chunk))
            result = conn.exec_driver_sql(
                "SELECT cluster, shape_id, backend, source, buckets FROM fleet_counts "
                f"WHERE (cluster, shape_id, backend, source) IN (VALUES {values})",
                tuple(v for key in chunk for v in key),
            )
            for c, s, b, src, buckets in result:
                current[(c, s, b, src)] = json.loads(buckets)
        upserts, deletes = [], []
        for key in keys:
            counts = current.get(key) or [0] * STAGE_BUCKETS
            merged = [max(0, a + d) for a, d in zip(counts, delta[key], strict=True)]
            total = sum(merged)
            if total:
                upserts.append((*key, total, json.dumps(merged, separators=(",", ":"))))
            elif key in current:
                deletes.append(key)
        if upserts:
            conn.exec_driver_sql(self._sql["fleet_upsert"], upserts)
        if deletes:
            conn.exec_driver_sql(self._sql["fleet_delete"], deletes)
        bumped = conn.exec_driver_sql(self._sql["fleet_bump"]).scalar()
        self._bumped = int(bumped or 0)

    def _prepare_sql(self) -> dict[str, str]:
        mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"

        def values(n: int) -> str:
            return "(" + ", ".join([mark] * n) + ")"

        return {
            "shapes": f"INSERT INTO shapes (id, request) VALUES {values(2)} "
            "ON CONFLICT (id) DO NOTHING",
            "answers": f"INSERT INTO answers (id, answer) VALUES {values(2)} "
            "ON CONFLICT (id) DO NOTHING",
            "decisions": "INSERT INTO decisions (id, created_at, cluster, node, pod, backend, "
            f"source, rules_revision, shape_id, answer_id) VALUES {values(10)} "
            "ON CONFLICT (id) DO NOTHING",
            "pod_latest": "INSERT INTO pod_latest (cluster, node, pod, decision_id, backend, "
            f"source, created_at, answer_id, shape_id, bucket) VALUES {values(10)} "
            f"{_POD_LATEST_CONFLICT}",
            "fleet_upsert": "INSERT INTO fleet_counts (cluster, shape_id, backend, source, pods, "
            f"buckets) VALUES {values(6)} ON CONFLICT (cluster, shape_id, backend, source) "
            "DO UPDATE SET pods = excluded.pods, buckets = excluded.buckets",
            "fleet_delete": f"DELETE FROM fleet_counts WHERE cluster = {mark} AND "
            f"shape_id = {mark} AND backend = {mark} AND source = {mark}",
            "fleet_bump": "UPDATE meta SET value = value + 1 WHERE key = 'fleet_version' "
            "RETURNING value",
        }

    # -------------------------------------------------------------------- reads
    def count_decisions(self) -> int:
        with Session(self.engine) as s:
            return s.scalar(select(func.count()).select_from(DecisionRow)) or 0

    def _with_request(self) -> Any:
        return select(DecisionRow, ShapeRow.request).outerjoin(
            ShapeRow, ShapeRow.id == DecisionRow.shape_id
        )

    def list_decisions(
        self,
        *,
        cluster: str | None,
        backend: str | None,
        pod: str | None = None,
        limit: int,
        before_id: str | None,
    ) -> list[DecisionRecord]:
        q = self._with_request().order_by(DecisionRow.id.desc()).limit(limit)
        if cluster is not None:
            q = q.where(DecisionRow.cluster == cluster)
        if backend is not None:
            q = q.where(DecisionRow.backend == backend)
        if pod is not None:
            q = q.where(DecisionRow.pod == pod)
        if before_id is not None:
            q = q.where(DecisionRow.id < before_id)
        with Session(self.engine) as s:
            return [_decision(r, shape) for r, shape in s.execute(q)]

    def get_decision(self, decision_id: str) -> DecisionRecord | None:
        with Session(self.engine) as s:
            found = s.execute(self._with_request().where(DecisionRow.id == decision_id)).first()
            if found is None:
                return None
            row, shape = found
            answer = s.get(AnswerRow, row.answer_id)
            return _decision(row, shape, None if answer is None else answer.answer)

    def summary(self) -> dict[str, dict[str, int]]:
        """Pods per cluster and backend (each named pod's newest decision)."""
        q = select(FleetCount.cluster, FleetCount.backend, func.sum(FleetCount.pods)).group_by(
            FleetCount.cluster, FleetCount.backend
        )
        out: dict[str, dict[str, int]] = {}
        with Session(self.engine) as s:
            for cluster, backend, n in s.execute(q):
                if n:
                    out.setdefault(cluster, {})[backend] = int(n)
        return {c: dict(sorted(b.items())) for c, b in sorted(out.items())}

    def fleet_version(self) -> int:
        with Session(self.engine) as s:
            return s.scalar(select(Meta.value).where(Meta.key == "fleet_version")) or 0

    def fleet_groups(self) -> tuple[int, list[FleetGroup]]:
        """Every group with its per-bucket counts, and the ``fleet_version`` they are as
        of (read in one transaction): O(clusters x shapes x backends) rows."""
        with self.engine.connect() as conn, conn.begin():
            version = conn.execute(
                select(Meta.value).where(Meta.key == "fleet_version")
            ).scalar_one_or_none()
            q = select(
                FleetCount.cluster,
                FleetCount.shape_id,
                FleetCount.backend,
                FleetCount.source,
                FleetCount.pods,
                FleetCount.buckets,
            )
            groups = [
                FleetGroup(c, s, b, src, n, tuple(json.loads(buckets)))
                for c, s, b, src, n, buckets in conn.execute(q)
            ]
        return version or 0, groups

    def shapes(self, ids: Iterable[str]) -> dict[str, str]:
        """Shape JSON by id; shapes never change, so each is read from the store once."""
        wanted = [i for i in set(ids) if i not in self._shapes]
        if wanted:
            with self.engine.connect() as conn:
                for i in range(0, len(wanted), 500):
                    q = select(ShapeRow.id, ShapeRow.request).where(
                        ShapeRow.id.in_(wanted[i : i + 500])
                    )
                    self._shapes.update({k: v for k, v in conn.execute(q)})
        return {i: self._shapes[i] for i in ids if i in self._shapes}

    def list_pods(
        self, where: PodFilter, *, after: tuple[str, str, str] | None, limit: int
    ) -> list[LivePod]:
        """Live pods in (cluster, node, pod) order after the cursor ``after``: one page
        costs an index range scan of the primary key, however large the fleet."""
        p = PodLatest
        q = select(
            p.cluster, p.node, p.pod, p.decision_id, p.backend, p.source, p.created_at,
            p.shape_id, p.bucket,
        )  # fmt: skip
        if where.cluster_globs is not None:
            q = q.where(or_(*(_glob(p.cluster, g) for g in where.cluster_globs)))
        if where.backends is not None:
            q = q.where(p.backend.in_(where.backends))
        if where.sources is not None:
            q = q.where(p.source.in_(where.sources))
        if where.shape_ids is not None:
            q = q.where(p.shape_id.in_(where.shape_ids))
        if where.buckets is not None:
            q = q.where(p.bucket.in_(where.buckets))
        if where.prefix:
            start = _like_escape(where.prefix) + "%"
            q = q.where(or_(p.pod.like(start, escape="\\"), p.node.like(start, escape="\\")))
        if after is not None:
            q = q.where(tuple_(p.cluster, p.node, p.pod) > tuple_(*after))
        q = q.order_by(p.cluster, p.node, p.pod).limit(limit)
        with self.engine.connect() as conn:
            return [
                LivePod(c, n, pod, d, b, src, aware(at), shape, bucket)
                for c, n, pod, d, b, src, at, shape, bucket in conn.execute(q)
            ]

    def expire_pods(self, seen_before: datetime, limit: int = 5000) -> int:
        """Take pods whose newest decision is older than ``seen_before`` out of the live
        fleet (``pod_latest`` and the counts), at most ``limit`` per call so the fleet
        lock is held briefly; their decisions stay in the log. Returns how many."""
        with self.engine.begin() as conn:
            if not self._postgres:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.exec_driver_sql(_PG_FLEET_LOCK)
            p = PodLatest
            stale = conn.execute(
                select(
                    p.cluster, p.node, p.pod, p.decision_id, p.shape_id, p.backend, p.source,
                    p.bucket,
                )
                .where(p.created_at < seen_before)
                .order_by(p.created_at)
                .limit(limit)
            ).all()  # fmt: skip
            if not stale:
                return 0
            delta: dict[GroupKey, list[int]] = defaultdict(lambda: [0] * STAGE_BUCKETS)
            for c, _n, pod, _d, shape, backend, source, bucket in stale:
                if shape is not None:
                    b = bucket if bucket is not None else (stage_bucket(c, pod) or 0)
                    delta[(c, shape, backend, source)][b] -= 1
            for i in range(0, len(stale), 300):
                chunk = stale[i : i + 300]
                conn.execute(
                    delete(p).where(
                        tuple_(p.cluster, p.node, p.pod, p.decision_id).in_(
                            [(r[0], r[1], r[2], r[3]) for r in chunk]
                        )
                    )
                )
            if delta:
                self._apply_counts(conn, delta)
            else:
                conn.exec_driver_sql(self._sql["fleet_bump"])
        return len(stale)

    def latest_per_pod(self) -> list[PodState]:
        """Every named pod's newest decision, with the request it sent. O(pods): for
        tests and diagnostics; the service's fleet reads use ``fleet_groups``."""
        q = (
            select(
                PodLatest.cluster,
                PodLatest.node,
                PodLatest.pod,
                PodLatest.decision_id,
                PodLatest.backend,
                PodLatest.source,
                DecisionRow.request,
                ShapeRow.request,
            )
            .join(DecisionRow, DecisionRow.id == PodLatest.decision_id)
            .outerjoin(ShapeRow, ShapeRow.id == DecisionRow.shape_id)
        )
        with self.engine.connect() as conn:
            return [
                PodState(c, n, p, d, b, src, _request_json(request, shape, c, n or None, p))
                for c, n, p, d, b, src, request, shape in conn.execute(q)
            ]


def _glob(column: Any, glob: str) -> Any:
    """A cluster glob (``*``, ``?`` over [a-z0-9._-]) as SQL LIKE."""
    if not any(ch in glob for ch in "*?"):
        return column == glob
    pattern = _like_escape(glob).replace("*", "%").replace("?", "_")
    return column.like(pattern, escape="\\")


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _flat(rows: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    return tuple(itertools.chain.from_iterable(rows))


def _newest_per_pod(rows: Sequence[Row]) -> dict[PodKey, Row]:
    newest: dict[PodKey, Row] = {}
    for r in rows:
        if not r[4]:
            continue  # an unnamed pod cannot be counted as one pod
        key = (r[2], r[3] or "", r[4])
        if key not in newest or newest[key][0] < r[0]:
            newest[key] = r
    return newest


def _request_json(
    request: str | None, shape: str | None, cluster: str, node: str | None, pod: str | None
) -> str:
    if request is not None:
        return request
    return json.dumps(request_from_shape(shape or "{}", cluster, node, pod))


def _decision(r: DecisionRow, shape: str | None, answer_json: str | None = None) -> DecisionRecord:
    return DecisionRecord(
        id=r.id,
        created_at=aware(r.created_at),
        cluster=r.cluster,
        node=r.node,
        pod=r.pod,
        backend=r.backend,
        source=r.source,
        rules_revision=r.rules_revision,
        request_json=_request_json(r.request, shape, r.cluster, r.node, r.pod),
        answer_id=r.answer_id,
        answer_json=answer_json,
    )
