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

import json
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core.schemas import SelectRequest
from mla_switchboard.core.stages import STAGE_BUCKETS, stage_bucket
from mla_switchboard.service.state import DecisionRecord, PodState
from mla_switchboard.service.store.base import aware, newest_first
from mla_switchboard.service.store.batch_sql import POD_LATEST_CONFLICT, sqlite_rows, statements
from mla_switchboard.service.store.models import AnswerRow, DecisionRow, PodLatest, ShapeRow
from mla_switchboard.service.store.rows import Decision, FleetGroup, PodPointer, columns
from mla_switchboard.service.store.shapes import Shape, request_from_shape, shape_of_json
from sqlalchemy import Connection, Engine, delete, func, select, tuple_
from sqlalchemy.orm import Session

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
    principal: str | None = None,
    verified: bool = False,
) -> Decision:
    """The row ``/v1/select`` hands the recorder (``shape``: ``shape_of(request)``, which
    the selector computed once for every pod of that shape; ``principal`` and
    ``verified``: who asked, see ``rows.Decision``)."""
    return Decision(
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
        principal,
        verified,
    )


def rows_of(records: Iterable[DecisionRecord]) -> list[Decision]:
    """``DecisionRecord`` values (a whole request as JSON text) as the writer's rows."""
    out = []
    for d in records:
        shape = shape_of_json(d.request_json)
        out.append(
            Decision(
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
                d.principal,
                d.verified,
            )
        )
    return out


_STAGE_COLUMNS = (
    "id, created_at, cluster, node, pod, backend, source, rules_revision, shape_id, "
    "answer_id, bucket, principal, verified"
)
_PG_DECISIONS_FROM_STAGE = (
    "INSERT INTO decisions (id, created_at, cluster, node, pod, backend, source, "
    "rules_revision, shape_id, answer_id, principal, verified) SELECT id, created_at, "
    "cluster, node, pod, backend, source, rules_revision, shape_id, answer_id, principal, "
    "verified FROM sb_stage "
    "ON CONFLICT (id) DO NOTHING"
)
# each named pod's newest decision of the batch, in key order
_PG_POD_LATEST_FROM_STAGE = (
    "INSERT INTO pod_latest (cluster, node, pod, decision_id, backend, source, created_at, "
    "answer_id, shape_id, bucket) SELECT DISTINCT ON (cluster, coalesce(node, ''), pod) "
    "cluster, coalesce(node, ''), pod, id, backend, source, created_at, answer_id, shape_id, "
    "bucket FROM sb_stage WHERE pod <> '' "
    "ORDER BY cluster, coalesce(node, ''), pod, id DESC "
    f"{POD_LATEST_CONFLICT}"
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

_STAGE_READY = "sb_stage_v3"
"""Set in a connection's ``info`` once its temporary staging table exists."""

PodKey = tuple[str, str, str]
GroupKey = tuple[str, str, str, str]

CHANGES_KEPT = 256
"""How many of its own committed changes to the fleet's counts a store keeps for
readers in this process (``fleet_changes_since``)."""


@dataclass(frozen=True)
class FleetChange:
    """What one committed transaction of this process did to ``fleet_counts``: the
    ``fleet_version`` it made, the rows it wrote (as they now are) and the groups it
    emptied. A reader holding the counts as of the version before can apply it instead
    of reading every row again (``service/fleet/groups.py``)."""

    version: int
    rows: tuple[FleetGroup, ...] = ()
    gone: tuple[GroupKey, ...] = ()


class DecisionStore:
    def __init__(self, engine: Engine, *, writer: Engine | None = None) -> None:
        self.engine = engine
        # the batches' own engine: shorter lock and statement waits, a pool of its own
        self._writer = writer or engine
        self._known_answers: set[str] = set()
        self._known_shapes: set[str] = set()
        self._bumped = 0
        # the fleet_version this writer's last committed batch made (0: none yet)
        self.fleet_version_written = 0
        # this process's committed changes to the counts, newest last; the change a
        # transaction makes is noted per thread (the writer's, the pod expiry's) and
        # kept once it committed
        self._changes: deque[FleetChange] = deque(maxlen=CHANGES_KEPT)
        self._changes_lock = threading.Lock()
        self._change = threading.local()
        self._postgres = engine.dialect.name == "postgresql"
        self._sql = statements("?" if engine.dialect.paramstyle == "qmark" else "%s")
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

    def record_rows(self, rows: Sequence[Decision]) -> None:
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
        shapes = {r.shape_id: r.shape_json for r in rows if r.shape_id not in self._known_shapes}
        answers = {
            r.answer_id: r.answer_json
            for r in rows
            if r.answer_id not in self._known_answers and r.answer_json is not None
        }
        newest = _newest_per_pod(rows)
        self._bumped = 0
        self._change.made = None
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
        self._committed()
        if self._bumped:
            self.fleet_version_written = max(self.fleet_version_written, self._bumped)
        for known, new in ((self._known_shapes, shapes), (self._known_answers, answers)):
            if len(known) > KNOWN_LIMIT:
                known.clear()  # forgetting costs one harmless ON CONFLICT DO NOTHING each
            known.update(new)

    def _insert_sqlite(
        self, conn: Connection, rows: Sequence[Decision], newest: dict[PodKey, Decision]
    ) -> None:
        ts = self._timestamp
        sqlite_rows(
            conn,
            self._sql,
            "decisions",
            [
                (r.id, ts(r.created_at), r.cluster, r.node, r.pod, r.backend, r.source,
                 r.rules_revision, r.shape_id, r.answer_id, r.principal, r.verified)
                for r in rows
            ],
        )  # fmt: skip
        if not newest:
            return
        old = self._old_latest_sqlite(conn, list(newest))
        moved = self._move(conn, newest, old)
        if moved:
            sqlite_rows(
                conn,
                self._sql,
                "pod_latest",
                [
                    (
                        c,
                        n,
                        p,
                        r.id,
                        r.backend,
                        r.source,
                        ts(r.created_at),
                        r.answer_id,
                        r.shape_id,
                        stage_bucket(c, p),
                    )
                    for (c, n, p), r in sorted(moved.items())
                ],
            )

    def _old_latest_sqlite(self, conn: Connection, keys: list[PodKey]) -> dict[PodKey, PodPointer]:
        out: dict[PodKey, PodPointer] = {}
        for i in range(0, len(keys), 300):
            chunk = keys[i : i + 300]
            marks = ", ".join(["(?, ?, ?)"] * len(chunk))
            result = conn.exec_driver_sql(
                "SELECT cluster, node, pod, decision_id, shape_id, backend, source, bucket "
                f"FROM pod_latest WHERE (cluster, node, pod) IN (VALUES {marks})",
                tuple(v for key in chunk for v in key),
            )
            for row in map(PodPointer._make, result):
                out[(row.cluster, row.node, row.pod)] = row
        return out

    def _copy_postgres(
        self, conn: Connection, rows: Sequence[Decision], newest: dict[PodKey, Decision]
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
                    "rules_revision integer, shape_id text, answer_id text, bucket integer, "
                    "principal text, verified boolean) "
                    "ON COMMIT DELETE ROWS"
                )
                info[_STAGE_READY] = True
            with cur.copy(f"COPY sb_stage ({_STAGE_COLUMNS}) FROM STDIN") as copy:
                for r in rows:
                    copy.write_row(
                        (r.id, r.created_at, r.cluster, r.node, r.pod, r.backend, r.source,
                         r.rules_revision, r.shape_id, r.answer_id, stage_bucket(r.cluster, r.pod),
                         r.principal, r.verified)
                    )  # fmt: skip
            cur.execute(_PG_DECISIONS_FROM_STAGE)
            if not newest:
                return
            cur.execute(_PG_FLEET_LOCK)
            cur.execute(_PG_OLD_LATEST)
            pointers = map(PodPointer._make, cur.fetchall())
            old = {(r.cluster, r.node, r.pod): r for r in pointers}
        if self._move(conn, newest, old):
            conn.exec_driver_sql(_PG_POD_LATEST_FROM_STAGE)

    def _move(
        self, conn: Connection, newest: dict[PodKey, Decision], old: dict[PodKey, PodPointer]
    ) -> dict[PodKey, Decision]:
        """Apply to ``fleet_counts`` what the batch's newest decisions do to each pod's
        group; returns the pods that move (their stored decision is older)."""
        moved: dict[PodKey, Decision] = {}
        delta: dict[GroupKey, list[int]] = defaultdict(lambda: [0] * STAGE_BUCKETS)
        for key, r in newest.items():
            before = old.get(key)
            if before is not None and before.decision_id >= r.id:
                continue  # the store holds a newer decision of this pod
            moved[key] = r
            cluster, _, pod = key
            bucket = stage_bucket(cluster, pod)
            assert bucket is not None  # only named pods are counted
            if before is not None and before.shape_id is not None:
                was = before.bucket if before.bucket is not None else bucket
                delta[(cluster, before.shape_id, before.backend, before.source)][was] -= 1
            delta[(cluster, r.shape_id, r.backend, r.source)][bucket] += 1
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
            for row in result:
                key = (row.cluster, row.shape_id, row.backend, row.source)
                current[key] = json.loads(row.buckets)
        upserts, deletes, written = [], [], []
        for key in keys:
            counts = current.get(key) or [0] * STAGE_BUCKETS
            merged = [max(0, a + d) for a, d in zip(counts, delta[key], strict=True)]
            total = sum(merged)
            if total:
                upserts.append((*key, total, json.dumps(merged, separators=(",", ":"))))
                written.append(FleetGroup(*key, total, tuple(merged)))
            elif key in current:
                deletes.append(key)
        if upserts:
            conn.exec_driver_sql(self._sql["fleet_upsert"], upserts)
        if deletes:
            conn.exec_driver_sql(self._sql["fleet_delete"], deletes)
        bumped = conn.exec_driver_sql(self._sql["fleet_bump"]).scalar()
        self._bumped = int(bumped or 0)
        self._change.made = FleetChange(self._bumped, tuple(written), tuple(deletes))

    def _committed(self) -> None:
        """Keep the change the transaction just committed on this thread (if any)."""
        made = getattr(self._change, "made", None)
        self._change.made = None
        if made is not None and made.version:
            with self._changes_lock:
                self._changes.append(made)

    def fleet_changes_since(self, version: int) -> list[FleetChange]:
        """This process's committed changes to the fleet's counts after ``version``, in
        version order (those of other replicas are not here: a reader finds a gap)."""
        with self._changes_lock:
            found = [c for c in self._changes if c.version > version]
        return sorted(found, key=lambda c: c.version)

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
        q = newest_first(
            self._with_request(),
            DecisionRow.id,
            limit=limit,
            before_id=before_id,
            equal=(
                (DecisionRow.cluster, cluster),
                (DecisionRow.backend, backend),
                (DecisionRow.pod, pod),
            ),
        )
        with Session(self.engine) as s:
            return [_decision(row.DecisionRow, row.request) for row in s.execute(q)]

    def askers(self, cluster: str, pods: Sequence[str]) -> dict[str, tuple[str | None, bool]]:
        """Who asked for each named pod's newest decision in ``cluster``: (principal id,
        verified), what the rollout guards count a pod's samples under. A pod on several
        nodes answers for its newest decision; a pod not in the live fleet is left out."""
        out: dict[str, tuple[str | None, bool]] = {}
        newest: dict[str, str] = {}
        p, d = PodLatest, DecisionRow
        with self.engine.connect() as conn:
            for i in range(0, len(pods), 300):
                rows = conn.execute(
                    select(p.pod, p.decision_id, d.principal, d.verified)
                    .join(d, d.id == p.decision_id)
                    .where(p.cluster == cluster, p.pod.in_(pods[i : i + 300]))
                )
                for pod, decision_id, principal, verified in rows:
                    if decision_id > newest.get(pod, ""):
                        newest[pod] = decision_id
                        out[pod] = (principal, bool(verified))
        return out

    def get_decision(self, decision_id: str) -> DecisionRecord | None:
        with Session(self.engine) as s:
            found = s.execute(self._with_request().where(DecisionRow.id == decision_id)).first()
            if found is None:
                return None
            answer = s.get(AnswerRow, found.DecisionRow.answer_id)
            answer_json = None if answer is None else answer.answer
            return _decision(found.DecisionRow, found.request, answer_json)

    def expire_pods(self, seen_before: datetime, limit: int = 5000) -> int:
        """Take pods whose newest decision is older than ``seen_before`` out of the live
        fleet (``pod_latest`` and the counts), at most ``limit`` per call so the fleet
        lock is held briefly; their decisions stay in the log. Returns how many."""
        self._change.made = None
        with self.engine.begin() as conn:
            if not self._postgres:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.exec_driver_sql(_PG_FLEET_LOCK)
            p = PodLatest
            stale = [
                PodPointer._make(row)
                for row in conn.execute(
                    select(*columns(p, PodPointer))
                    .where(p.created_at < seen_before)
                    .order_by(p.created_at)
                    .limit(limit)
                )
            ]
            if not stale:
                return 0
            delta: dict[GroupKey, list[int]] = defaultdict(lambda: [0] * STAGE_BUCKETS)
            for r in stale:
                if r.shape_id is not None:
                    b = r.bucket if r.bucket is not None else (stage_bucket(r.cluster, r.pod) or 0)
                    delta[(r.cluster, r.shape_id, r.backend, r.source)][b] -= 1
            for i in range(0, len(stale), 300):
                chunk = stale[i : i + 300]
                conn.execute(
                    delete(p).where(
                        tuple_(p.cluster, p.node, p.pod, p.decision_id).in_(
                            [(r.cluster, r.node, r.pod, r.decision_id) for r in chunk]
                        )
                    )
                )
            if delta:
                self._apply_counts(conn, delta)
            else:
                bumped = conn.exec_driver_sql(self._sql["fleet_bump"]).scalar()
                self._change.made = FleetChange(int(bumped or 0))
        self._committed()
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
                ShapeRow.request.label("shape_json"),
            )
            .join(DecisionRow, DecisionRow.id == PodLatest.decision_id)
            .outerjoin(ShapeRow, ShapeRow.id == DecisionRow.shape_id)
        )
        with self.engine.connect() as conn:
            return [
                PodState(
                    r.cluster, r.node, r.pod, r.decision_id, r.backend, r.source,
                    _request_json(r.request, r.shape_json, r.cluster, r.node or None, r.pod),
                )
                for r in conn.execute(q)
            ]  # fmt: skip


def _newest_per_pod(rows: Sequence[Decision]) -> dict[PodKey, Decision]:
    newest: dict[PodKey, Decision] = {}
    for r in rows:
        if not r.pod:
            continue  # an unnamed pod cannot be counted as one pod
        key = (r.cluster, r.node or "", r.pod)
        if key not in newest or newest[key].id < r.id:
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
        principal=r.principal,
        verified=bool(r.verified),
    )
