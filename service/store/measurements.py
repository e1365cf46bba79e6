"""Evidence: benchmark reports and build-failure reports, and reading them back.

Turning rows into evidence is ``core.evidence``'s job (situations, observations);
this module only maps columns to its functions' arguments.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core.evidence import (
    LoadedSample,
    Observation,
    Situation,
    dims_key,
    engine_key,
    failure_observation,
    measurement_source,
    packages_key,
    situation_of,
)
from mla_switchboard.core.schemas import MeasurementReport, SelectRequest
from mla_switchboard.core.specs import format_capability
from mla_switchboard.service.store.audit import add_audit
from mla_switchboard.service.store.base import (
    Idempotency,
    Refused,
    Replayed,
    admin_write,
    aware,
    bump,
    bump_statement,
)
from mla_switchboard.service.store.guard_pending import Note, note_statement
from mla_switchboard.service.store.models import (
    DecisionRow,
    EvidenceClearRow,
    FailureRow,
    MeasurementRow,
    ShapeRow,
)
from mla_switchboard.service.store.rows import (
    ClearRead,
    FailureRead,
    MeasurementRead,
    MeasurementSample,
    columns,
)
from mla_switchboard.service.store.shapes import request_from_shape, shape_situation
from mla_switchboard.service.store.version_bump import GroupBump
from sqlalchemy import (
    Connection,
    Engine,
    Float,
    Integer,
    bindparam,
    cast,
    false,
    func,
    insert,
    literal,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.orm import Session

PAGE_ROWS = 5000
"""Rows per page of a full read: its memory stays bounded whatever the history."""
_NAIVE_EPOCH = datetime(1970, 1, 1)


@dataclass
class EvidenceRows:
    """One read of an evidence table: the id of every row read (counted or not, so
    the reader knows which ids it has seen) and the observations that count."""

    observations: list[Observation] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    more: bool = False  # the page was full: read on from its last id
    # a lean read's counted correct results, without an Observation each (a full
    # reload's bulk: core.evidence.EvidenceLoader); its failures stay observations
    samples: list[LoadedSample] = field(default_factory=list)
    _situations: dict[tuple[str, ...], Situation] = field(default_factory=dict, repr=False)

    def situation(self, *parts: str) -> Situation:
        """One ``Situation`` object per distinct situation of a read, not one per row."""
        found = self._situations.get(parts)
        if found is None:
            found = self._situations[parts] = Situation(*parts)
        return found


@dataclass(frozen=True)
class Clear:
    """One admin's clear: ``situation``'s failures (of ``backend``, or all) noted at or
    before ``at`` no longer count."""

    id: int
    at: datetime
    situation: Situation
    backend: str | None


@dataclass(frozen=True)
class SeenThrough:
    """The newest row ids of the two tables failures come from (wrong results among
    measurements, build failures) that the person clearing had seen: a clear leaves
    any row after them, reported after they looked."""

    measurement_id: int
    failure_id: int


@dataclass(frozen=True)
class Cleared:
    """What a clear did: ``count`` rows cleared; ``newer`` matching rows left because
    they came after what was seen (0 without ``SeenThrough``)."""

    count: int
    newer: int = 0


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(eq=False)
class MeasurementStore:
    engine: Engine
    # its own writes move ``evidence_version`` once per group of concurrent writes, not
    # each in its own transaction (``version_bump.py``); the service's reports are
    # stored in batches that move it in their own transaction (``store_reports``)
    _evidence_bump: GroupBump = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._evidence_bump = GroupBump(self.engine, "evidence_version")

    def add_measurements(
        self, report: MeasurementReport, report_id: str, *, counted: bool = True
    ) -> int:
        rows = measurement_rows(report, report_id, counted)
        # one multi-row INSERT, not one ORM object per result: a report holds up to
        # 256 results and runs in a worker thread beside the event loop
        with Session(self.engine) as s, s.begin():
            s.execute(insert(MeasurementRow), rows)
        self._evidence_bump.after_commit()
        return len(rows)

    def record_failure(
        self, decision_id: str, backend: str, error: str, at: datetime | None = None
    ) -> None:
        """``at``: the time the replica's own copy in memory carries too, so a clear up
        to the newest failure it cleared (by time, in memory) forgets that copy."""
        at = at or datetime.now(UTC)
        with Session(self.engine) as s, s.begin():
            s.add(FailureRow(at=at, decision_id=decision_id, backend=backend, error=error))
        self._evidence_bump.after_commit()  # a build failure is evidence too

    def failures_for(self, decision_id: str) -> list[dict[str, Any]]:
        with Session(self.engine) as s:
            return [
                {"at": aware(f.at).isoformat(), "backend": f.backend, "error": f.error}
                for f in s.scalars(
                    select(FailureRow)
                    .where(FailureRow.decision_id == decision_id)
                    .order_by(FailureRow.id)
                )
            ]

    def evidence(self, since: datetime) -> list[Observation]:
        """Every counted observation since ``since`` (measured results, then build
        failures), read in pages: a convenience over :meth:`measurement_rows` and
        :meth:`failure_rows` for tools and tests."""
        out: list[Observation] = []
        for failures in (False, True):
            read = self.failure_rows if failures else self.measurement_rows
            after = self.first_id(failures, since) - 1
            while True:
                page = read(since, after=after)
                out.extend(page.observations)
                if not page.more:
                    break
                after = page.ids[-1]
        return out

    def first_id(self, failures: bool, since: datetime) -> int:
        """The lowest row id (of ``failures`` or of measurements) stored at or after
        ``since``, or one past the highest when there is none: where a full read starts
        (found through the ``at`` index, not by scanning older history)."""
        table = FailureRow if failures else MeasurementRow
        with self.engine.connect() as conn:
            first = conn.scalar(select(func.min(table.id)).where(table.at >= since))
            if first is None:
                first = (conn.scalar(select(func.max(table.id))) or 0) + 1
        return int(first)

    def measurement_rows(
        self,
        since: datetime,
        *,
        after: int | None = None,
        ids: Collection[int] = (),
        limit: int = PAGE_ROWS,
        lean: bool = False,
    ) -> EvidenceRows:
        """Measurement rows with an id above ``after`` (ordered by id, at most
        ``limit``), or those with the given ``ids``: every row read is in ``ids`` of
        the answer, and those that count (from pods the service decided for, not
        cleared, not older than ``since``, with a GPU) are its observations; with
        ``lean``, its correct results are its ``samples`` instead (a full reload reads
        hundreds of thousands: an ``Observation`` each cost five times the read)."""
        if lean and after is not None:
            return self._samples(since, after, limit)
        m = MeasurementRow
        q = _page(select(*columns(m, MeasurementRead)), m.id, after, ids, limit)
        out = EvidenceRows()
        with self.engine.connect() as conn:
            for row in map(MeasurementRead._make, conn.execute(q)):
                out.ids.append(row.id)
                at = aware(row.at)
                if (
                    not row.counted
                    or row.cleared_at is not None
                    or row.capability is None
                    or at < since
                ):
                    continue
                out.observations.append(_observation(out, row, at))
        out.more = after is not None and len(out.ids) >= limit
        return out

    def wrong_rows(
        self, since: datetime, *, after: int, through: int, limit: int = PAGE_ROWS
    ) -> EvidenceRows:
        """The wrong results with an id above ``after`` and up to ``through`` (ordered
        by id, at most ``limit``), read through their own index, as
        :meth:`measurement_rows` reads them: what a load from an evidence snapshot
        reads again of the rows the snapshot covers (only correct results are kept in
        one; an admin's clear changes the wrong ones)."""
        m = MeasurementRow
        q = _page(
            select(*columns(m, MeasurementRead)).where(m.correct == false(), m.id <= through),
            m.id, after, (), limit,
        )  # fmt: skip
        out = EvidenceRows()
        with self.engine.connect() as conn:
            for row in map(MeasurementRead._make, conn.execute(q)):
                out.ids.append(row.id)
                at = aware(row.at)
                if not row.counted or row.cleared_at is not None or row.capability is None:
                    continue
                if at >= since:
                    out.observations.append(_observation(out, row, at))
        out.more = len(out.ids) >= limit
        return out

    def _samples(self, since: datetime, after: int, limit: int) -> EvidenceRows:
        """``measurement_rows(lean=True)``: the same rows and the same choice of what
        counts, read through the driver (``_driver_rows``), its correct results as
        ``LoadedSample`` tuples and its wrong ones as observations."""
        cutoff = since.timestamp()
        out = EvidenceRows()
        with self.engine.connect() as conn:
            q = _SAMPLES.get(conn.dialect.name, _SAMPLES_AS_STORED)
            rows = _driver_rows(conn, q, {"after": after, "limit": limit})
        epoch = q is not _SAMPLES_AS_STORED
        seen, samples, situations = out.ids.append, out.samples.append, out._situations
        for row in rows:
            (id_, counted, cleared_at, capability, at, correct, tflops, device, dims, dtype,
             packages, engine, backend, cluster, pod, impl, report_id, error) = row  # fmt: skip
            seen(id_)
            if not counted or cleared_at is not None or capability is None:
                continue
            if epoch:
                key = at
            else:  # SQLite's stored text, in UTC and (as SQLAlchemy writes it) no zone
                at = datetime.fromisoformat(at) if isinstance(at, str) else at
                key = (at - _NAIVE_EPOCH).total_seconds() if at.tzinfo is None else at.timestamp()
            if key < cutoff:
                continue
            if correct and tflops is not None:
                parts = (device, capability, dims, dtype, packages, engine)
                situation = situations.get(parts)
                if situation is None:
                    situation = situations[parts] = Situation(*parts)
                samples((situation, backend, cluster, pod, key, tflops, impl, report_id))
                continue
            wrong = MeasurementRead(
                id=id_, device_name=device, capability=capability, dims=dims, dtype=dtype,
                packages=packages, engine=engine, backend=backend, pod=pod, cluster=cluster,
                at=datetime.fromtimestamp(key, UTC), tflops=tflops, correct=bool(correct),
                error=error, impl=impl,
                report_id=report_id, counted=bool(counted), cleared_at=None,
            )  # fmt: skip
            out.observations.append(_observation(out, wrong, wrong.at))
        out.more = len(out.ids) >= limit
        return out

    def failure_rows(
        self,
        since: datetime,
        *,
        after: int | None = None,
        ids: Collection[int] = (),
        limit: int = PAGE_ROWS,
    ) -> EvidenceRows:
        """Build-failure rows, as :meth:`measurement_rows` reads measurements: each
        keyed by the situation of the failing pod's decision (what an admin cleared,
        or older than ``since``, does not count)."""
        q = _page(_failures_with_requests(), FailureRow.id, after, ids, limit)
        out = EvidenceRows()
        with self.engine.connect() as conn:
            for row in map(FailureRead._make, conn.execute(q)):
                out.ids.append(row.id)
                at = aware(row.at)
                if row.cleared_at is not None or at < since:
                    continue
                request = _request(row.request_json, row.shape_json, row.cluster, row.node, row.pod)
                if request is None:
                    continue  # recorded under an older schema
                observation = failure_observation(
                    request, row.backend, row.error, at, row.pod, row.decision_id
                )
                if observation is not None:
                    out.observations.append(observation)
        out.more = after is not None and len(out.ids) >= limit
        return out

    def clear_failures(
        self,
        situation: Situation,
        backend: str | None,
        *,
        actor: str,
        note: str,
        idempotency: Idempotency | None = None,
        seen: SeenThrough | None = None,
    ) -> Cleared | Replayed:
        """Mark a situation's failures (wrong results and failed builds, one backend or
        all) cleared, audited; measured selection stops counting them. With ``seen``,
        only the rows up to it: a failure reported after the person looked stays, and
        is counted as ``newer``. Returns what it did (or what an earlier request with
        the same ``idempotency`` key was answered)."""
        try:
            return self._clear_failures(situation, backend, actor, note, idempotency, seen)
        except Refused as refused:
            return refused.result  # type: ignore[no-any-return]

    def _clear_failures(
        self,
        situation: Situation,
        backend: str | None,
        actor: str,
        note: str,
        idempotency: Idempotency | None,
        seen: SeenThrough | None,
    ) -> Cleared:
        now = datetime.now(UTC)
        with admin_write(self.engine, idempotency) as (s, _):
            m = MeasurementRow
            wrong = [
                m.correct.is_(False),
                m.cleared_at.is_(None),
                m.device_name == situation.device,
                m.capability == situation.capability,
                m.dims == situation.dims,
                m.dtype == situation.dtype,
                m.packages == situation.packages,
                m.engine == situation.engine,
            ]
            if backend is not None:
                wrong.append(m.backend == backend)
            newer = 0
            newest = EPOCH  # the newest cleared failure's time (what replicas forget)
            if seen is not None:
                newer += (
                    s.scalar(select(func.count()).where(*wrong, m.id > seen.measurement_id)) or 0
                )
                wrong.append(m.id <= seen.measurement_id)
                newest = max(newest, aware(s.scalar(select(func.max(m.at)).where(*wrong)) or EPOCH))
            cleared = s.execute(update(m).where(*wrong).values(cleared_at=now)).rowcount or 0
            ids, newer_failures, newest_failure = _failures_to_clear(s, situation, backend, seen)
            newer += newer_failures
            newest = max(newest, newest_failure)
            if ids:
                s.execute(update(FailureRow).where(FailureRow.id.in_(ids)).values(cleared_at=now))
            cleared += len(ids)
            add_audit(
                s,
                actor=actor,
                action="evidence.clear_failures",
                target=situation.device,
                before=None,
                after={
                    "situation": asdict(situation),
                    "backend": backend,
                    "cleared": cleared,
                    "newer_not_cleared": newer,
                    "seen_through": None if seen is None else asdict(seen),
                },
                note=note,
                preview=None,
            )
            # every replica forgets these failures in place when it reads this row
            # (service/evidence/sync.py: the rows it read before are not read again);
            # keyed by what was seen, they forget failures noted up to the newest one
            # cleared, not up to now: one reported since stays counted there too
            s.add(_clear_row(situation, backend, now if seen is None else newest))
            bump(s, "evidence_version")
            done = Cleared(cleared, newer)
            if idempotency is not None:
                idempotency.keep(s, done)
        return done

    def clear_rows(self, *, after: int | None = None, ids: Collection[int] = ()) -> list[Clear]:
        """The admins' clears with an id above ``after`` (ordered by id), or those with
        the given ``ids``: what a replica applies to its evidence in place."""
        c = EvidenceClearRow
        q = _page(select(*columns(c, ClearRead)), c.id, after, ids, PAGE_ROWS)
        with self.engine.connect() as conn:
            return [
                Clear(
                    row.id,
                    aware(row.at),
                    Situation(
                        row.device_name, row.capability, row.dims, row.dtype, row.packages,
                        row.engine,
                    ),
                    row.backend,
                )
                for row in map(ClearRead._make, conn.execute(q))
            ]  # fmt: skip

    def last_clear_id(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.scalar(select(func.max(EvidenceClearRow.id))) or 0)


def _samples_query(epoch: bool) -> Any:
    """A full reload's page of measurement rows (``MeasurementStore._samples``); with
    ``epoch``, ``at`` as seconds since 1970 (PostgreSQL's exact microseconds, rounded
    once to a double as Python rounds them: a datetime each and its ``timestamp()``
    cost a microsecond a row)."""
    m = MeasurementRow
    chosen = [
        cast(func.extract("epoch", m.at), Float) if epoch and c.key == "at" else c
        for c in columns(m, MeasurementSample)
    ]
    return select(*chosen).where(m.id > bindparam("after")).order_by(m.id).limit(bindparam("limit"))


_SAMPLES = {"postgresql": _samples_query(epoch=True)}
_SAMPLES_AS_STORED = _samples_query(epoch=False)
_COMPILED: dict[tuple[Any, str], Any] = {}
"""Statements that ``_driver_rows`` reads, compiled per dialect."""


def _driver_rows(conn: Connection, q: Any, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """``q``'s rows as the database driver gives them: plain tuples, without a
    SQLAlchemy row or its type handling each (a full reload reads every row of the
    window, and those cost 2 us a row, as much as the driver's own work). The
    statement is compiled for the connection's dialect (cached by SQLAlchemy); SQLite
    gives a time back as the text it stored."""
    compiled = _COMPILED.get((q, conn.dialect.name))
    if compiled is None:
        compiled = _COMPILED[(q, conn.dialect.name)] = q.compile(dialect=conn.dialect)
    bound = compiled.construct_params(params)
    values: Any = (
        bound if compiled.positiontup is None else [bound[k] for k in compiled.positiontup]
    )
    cursor = conn.connection.cursor()
    try:
        cursor.execute(str(compiled), values)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def _page(q: Any, id_column: Any, after: int | None, ids: Collection[int], limit: int) -> Any:
    if after is not None:
        return q.where(id_column > after).order_by(id_column).limit(limit)
    return q.where(id_column.in_(sorted(ids))).order_by(id_column)


def _failures_with_requests() -> Any:
    """Failure rows with what their decision recorded, in ``FailureRead``'s order. Outer
    joins, so a failure row is read (its id seen) even when its decision cannot be."""
    return (
        select(
            FailureRow.id,
            FailureRow.backend,
            FailureRow.error,
            FailureRow.at,
            FailureRow.cleared_at,
            DecisionRow.request,
            ShapeRow.request,
            DecisionRow.cluster,
            DecisionRow.node,
            DecisionRow.pod,
            FailureRow.decision_id,
        )
        .join(DecisionRow, DecisionRow.id == FailureRow.decision_id, isouter=True)
        .outerjoin(ShapeRow, ShapeRow.id == DecisionRow.shape_id)
    )


def _observation(rows: EvidenceRows, row: MeasurementRead, at: datetime) -> Observation:
    """A counted measurement as evidence (its situation shared with the read's others)."""
    ok = row.correct
    return Observation(
        rows.situation(
            row.device_name, row.capability, row.dims, row.dtype, row.packages, row.engine
        ),
        row.backend,
        row.pod,
        row.tflops,
        ok=bool(ok),
        cluster=row.cluster,
        at=at,
        error=row.error if row.error is not None else (None if ok else "wrong result"),
        impl=row.impl,
        source=measurement_source(row.report_id, row.id),
    )


def _request(
    request_json: str | None,
    shape_json: str | None,
    cluster: str,
    node: str | None,
    pod: str | None,
) -> SelectRequest | None:
    """A decision's request, from its own text (older rows) or its shape; None when it
    no longer validates (recorded under an older schema)."""
    try:
        if request_json is not None:
            return SelectRequest.model_validate_json(request_json)
        if shape_json is None:
            return None
        return SelectRequest.model_validate(request_from_shape(shape_json, cluster, node, pod))
    except ValueError:
        return None


def _clear_row(situation: Situation, backend: str | None, now: datetime) -> EvidenceClearRow:
    """A clear's row: the situation's fields are its columns (the device's name under
    ``device_name``), so a field the situation gains cannot be left out of its clears."""
    columns = asdict(situation)
    return EvidenceClearRow(at=now, device_name=columns.pop("device"), backend=backend, **columns)


def _failures_to_clear(
    s: Session, situation: Situation, backend: str | None, seen: SeenThrough | None
) -> tuple[list[int], int, datetime]:
    """The uncleared failure reports of ``situation`` (and ``backend``) a clear takes:
    their ids, how many arrived after what the person saw (``seen``: left), and the
    newest taken one's time. A report's situation is its decision's, worked out from
    the stored request (or, for an old row, its shape)."""
    ids: list[int] = []
    newer = 0
    newest = EPOCH
    q = _failures_with_requests().where(FailureRow.cleared_at.is_(None))
    for row in map(FailureRead._make, s.execute(q)):
        if backend is not None and row.backend != backend:
            continue
        if row.request_json is None and row.shape_json is not None:
            matches = shape_situation(row.shape_json) == situation
        else:
            request = _request(row.request_json, row.shape_json, row.cluster, row.node, row.pod)
            matches = request is not None and situation_of(request) == situation
        if not matches:
            continue
        if seen is not None and row.id > seen.failure_id:
            newer += 1
            continue
        ids.append(row.id)
        newest = max(newest, aware(row.at))
    return ids, newer, newest


def measurement_rows(
    report: MeasurementReport, report_id: str, counted: bool = True, at: datetime | None = None
) -> list[dict[str, Any]]:
    """A report's rows, one per result, received at ``at`` (now when None)."""
    cap = report.device.capability
    m = report.model
    now = datetime.now(UTC) if at is None else at
    dims = dims_key(m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim)
    packages, engine = packages_key(report.packages), engine_key(report.engine)
    return [
        {
            "report_id": report_id,
            "at": now,
            "cluster": report.cluster,
            "node": report.node,
            "pod": report.pod,
            "device_name": report.device.name or "",
            "capability": None if cap is None else format_capability(cap),
            "dims": dims,
            "num_heads": m.num_heads,
            "dtype": report.dtype.value,
            "packages": packages,
            "backend": r.backend.value,
            "impl": r.impl,
            "shape": r.shape.model_dump_json(),
            "median_ms": r.median_ms,
            "tflops": r.tflops,
            "correct": r.correct and r.error is None,
            "error": r.error,
            "engine": engine,
            "counted": counted,
        }
        for r in report.results
    ]


POD_DECISIONS_READ = 20
"""A pod's newest decisions compared with its report's situation (a pod that changed
packages has a newer one)."""

# The report path's statements, built once: a statement built per call costs more of
# the service's CPU (its expression and cache key) than the database takes to run it.
_INSERT = insert(MeasurementRow)
_STORED_IDS = select(MeasurementRow.report_id).where(
    MeasurementRow.report_id.in_(bindparam("ids", expanding=True))
)
_EVIDENCE_BUMP = bump_statement("evidence_version")


def _decided(rows: Collection[Any], cluster: str, pod: str, situation: Situation | None) -> bool:
    """Whether one of a pod's decisions (rows of its ``request``, ``shape_json`` and
    ``node``, as ``_newest_decisions`` reads them) is for ``situation``."""
    for row in rows:
        if row.request is None and row.shape_json is not None:
            if shape_situation(row.shape_json) == situation:
                return True
            continue
        request = _request(row.request, row.shape_json, cluster, row.node, pod)
        if request is not None and situation_of(request) == situation:
            return True
    return False


def _newest_decisions(
    conn: Connection, checked: list[PendingReport]
) -> dict[tuple[str, str, str | None], list[Any]]:
    """The newest decisions of every pod of ``checked`` (the newest
    ``POD_DECISIONS_READ`` of each, since a pod name reused for months has many; with an
    asker, only those it asked for or recorded before askers were kept), keyed by
    (cluster, pod, asker): one statement for the batch, each pod's
    bounded read a part of it, not one round trip per report."""
    wanted = sorted({(p.report.cluster, p.report.pod, p.asker) for p in checked}, key=str)
    if not wanted:
        return {}
    d, s = DecisionRow, ShapeRow
    parts = []
    for i, (cluster, pod, asker) in enumerate(wanted):
        newest = (
            select(
                literal(i, Integer).label("n"),
                d.request.label("request"),
                s.request.label("shape_json"),
                d.node.label("node"),
            )
            .outerjoin(s, s.id == d.shape_id)
            .where(d.cluster == cluster, d.pod == pod)
            .order_by(d.id.desc())
            .limit(POD_DECISIONS_READ)
        )
        if asker is not None:
            newest = newest.where(or_(d.principal == asker, d.principal.is_(None)))
        # each part's ORDER BY and LIMIT inside a subquery of its own: SQLite takes them
        # on a UNION ALL's parts only there
        parts.append(select(newest.subquery(f"q{i}")))
    out: dict[tuple[str, str, str | None], list[Any]] = {}
    for row in conn.execute(union_all(*parts)):
        out.setdefault(wanted[row.n], []).append(row)
    return out


@dataclass(eq=False)
class PendingReport:
    """A measurement report to store: ``situation`` None (nothing to check) or
    ``decided`` (the pod's decision for it is in the decision log) make it count; else
    the pod's stored decisions are looked up (``store_reports``). ``note``: its guard
    note (``service/guard_notes.py``), stored with it when it counts. ``observations``:
    the evidence it adds once stored (what the caller applies in memory)."""

    report: MeasurementReport
    report_id: str
    situation: Situation | None
    asker: str | None
    note: Note | None = None
    decided: bool = False
    observations: list[Observation] = field(default_factory=list)

    @property
    def checked(self) -> bool:
        """Whether it counts only if the pod has a stored decision for its situation."""
        return self.situation is not None and not self.decided


def store_reports(conn: Connection, batch: list[PendingReport]) -> list[StoredReport | None]:
    """Reports stored in the caller's transaction on ``conn``, each answered in order:
    None for one whose ``report_id`` is stored already or comes earlier in ``batch`` (a
    retry: nothing added). One duplicate check, one insert of every row and one move of
    ``evidence_version`` for the whole batch: a group of reports costs the driver's
    round trips and the commit of one."""
    asked = [p.report_id for p in batch if p.report.report_id is not None]
    seen = set(conn.scalars(_STORED_IDS, {"ids": asked})) if asked else set()
    now = datetime.now(UTC)
    fresh: list[PendingReport | None] = []
    for p in batch:
        if p.report.report_id is not None:
            if p.report_id in seen:
                fresh.append(None)
                continue
            seen.add(p.report_id)
        fresh.append(p)
    newest = _newest_decisions(conn, [p for p in fresh if p is not None and p.checked])
    rows: list[dict[str, Any]] = []
    out: list[StoredReport | None] = []
    for p in fresh:
        if p is None:
            out.append(None)
            continue
        report = p.report
        counted = not p.checked or _decided(
            newest.get((report.cluster, report.pod, p.asker), ()),
            report.cluster,
            report.pod,
            p.situation,
        )
        mine = measurement_rows(report, p.report_id, counted, now)
        rows.extend(mine)
        noted = counted and p.note is not None
        if noted:
            assert p.note is not None
            conn.execute(note_statement(conn.engine, p.note, now))
        out.append(StoredReport(counted=counted, results=len(mine), noted=noted))
    if rows:
        conn.execute(_INSERT, rows)
    if any(o is not None for o in out):
        # other replicas learn of the rows from this; in the batch's own transaction
        # the row's lock is held across one commit per batch, not one per report
        conn.execute(_EVIDENCE_BUMP)
    return out


@dataclass(frozen=True)
class StoredReport:
    """What ``store_reports`` stored of a report: whether the report counts, how
    many results, and whether its guard note was stored with it."""

    counted: bool
    results: int
    noted: bool
