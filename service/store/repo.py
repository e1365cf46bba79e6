"""All reads and writes of the service's tables, behind one small class.

Admin writes run in one transaction each together with their audit entry and a bump
of ``config_version`` (how other replicas notice them). Conflicts come back as
values (``Conflict``), never as exceptions the HTTP layer has to guess about.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mla_switchboard.core.schemas import (
    SEED_RULES,
    MeasurementReport,
    Override,
    OverrideSpec,
    RulesDocument,
)
from mla_switchboard.service.store.models import (
    AnswerRow,
    AuditRow,
    DecisionRow,
    FailureRow,
    MeasurementRow,
    Meta,
    OverrideRow,
    PodLatest,
    RulesRevision,
    TokenRow,
)
from sqlalchemy import Engine, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from mla_switchboard.core.evidence import Observation


@dataclass(frozen=True)
class Conflict:
    """A write refused because the caller's If-Match no longer matches."""

    current_etag: str


class _Refused(Exception):
    """Raised inside ``Store._admin_write`` to roll the write back and answer ``result``."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result


@dataclass(frozen=True)
class TokenRecord:
    id: str
    name: str
    role: str
    clusters: tuple[str, ...] | None
    secret_hash: str
    created_at: datetime
    revoked: bool


@dataclass(frozen=True)
class ConfigSnapshot:
    """Everything the hot path needs, loaded in one go and swapped in atomically."""

    version: int
    rules: RulesDocument
    overrides: tuple[Override, ...]
    tokens: dict[str, TokenRecord]


@dataclass(frozen=True)
class PodState:
    cluster: str
    node: str
    pod: str
    decision_id: str
    backend: str
    source: str
    request_json: str


@dataclass(frozen=True)
class DecisionRecord:
    id: str
    created_at: datetime
    cluster: str
    node: str | None
    pod: str | None
    backend: str
    source: str
    rules_revision: int
    request_json: str
    answer_id: str
    answer_json: str | None  # None when read back without its answer

    @property
    def request(self) -> dict[str, Any]:
        return json.loads(self.request_json)

    @property
    def answer(self) -> dict[str, Any]:
        return {} if self.answer_json is None else json.loads(self.answer_json)


def rules_etag(revision: int) -> str:
    return f'"rules-{revision}"'


def override_etag(cluster: str, revision: int) -> str:
    return f'"override-{cluster}-{revision}"'


def _aware(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; everything we store is UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._known_answers: set[str] = set()
        self._sql = self._prepare_sql()
        if engine.dialect.name == "sqlite":
            # SQLAlchemy's own SQLite DateTime text format, naive UTC
            self._timestamp: Callable[[datetime], Any] = lambda d: (
                d.astimezone(UTC).replace(tzinfo=None).isoformat(" ")
            )
        else:
            self._timestamp = lambda d: d

    # ------------------------------------------------------------------ config
    def ensure_seeded(self) -> None:
        """Revision 1 of the rules and the version counters, unless already there.

        ``INSERT ... ON CONFLICT DO NOTHING`` (same SQL on both dialects), not
        read-then-insert: replicas starting together on an empty database would both
        read "nothing there" and the second would fail on the primary key.
        """
        insert = postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert
        with Session(self.engine) as s, s.begin():
            s.execute(
                insert(RulesRevision)
                .values(
                    revision=1,
                    document=SEED_RULES.rules_only(),
                    created_at=datetime.now(UTC),
                    created_by="seed",
                )
                .on_conflict_do_nothing(index_elements=["revision"])
            )
            for key in ("config_version", "evidence_version"):
                s.execute(
                    insert(Meta)
                    .values(key=key, value=1)
                    .on_conflict_do_nothing(index_elements=["key"])
                )

    def config_version(self) -> int:
        return self.versions().get("config_version", 0)

    def versions(self) -> dict[str, int]:
        """``config_version`` and ``evidence_version`` in one round trip (the poller's)."""
        with Session(self.engine) as s:
            return {k: v for k, v in s.execute(select(Meta.key, Meta.value))}

    def load_config(self) -> ConfigSnapshot:
        with Session(self.engine) as s:
            version = s.scalar(select(Meta.value).where(Meta.key == "config_version")) or 0
            row = s.scalars(
                select(RulesRevision).order_by(RulesRevision.revision.desc()).limit(1)
            ).one()
            rules = RulesDocument.model_validate(
                {**row.document, "revision": row.revision, "updated_at": _aware(row.created_at)}
            )
            overrides = tuple(self._override(o) for o in s.scalars(select(OverrideRow)))
            tokens = {
                t.id: TokenRecord(
                    id=t.id,
                    name=t.name,
                    role=t.role,
                    clusters=None if t.clusters is None else tuple(t.clusters),
                    secret_hash=t.secret_hash,
                    created_at=_aware(t.created_at),
                    revoked=t.revoked_at is not None,
                )
                for t in s.scalars(select(TokenRow))
            }
        return ConfigSnapshot(version=version, rules=rules, overrides=overrides, tokens=tokens)

    @staticmethod
    def _override(row: OverrideRow) -> Override:
        return Override.model_validate(
            {
                **row.spec,
                "cluster": row.cluster,
                "created_at": _aware(row.created_at),
                "created_by": row.created_by,
                "revision": row.revision,
            }
        )

    @contextmanager
    def _admin_write(self) -> Iterator[tuple[Session, int]]:
        """One admin write's transaction, with ``config_version`` bumped *first*.

        The bump's row lock (PostgreSQL) or write lock (SQLite) serialises admin writes
        across replicas and threads, so the If-Match check that follows reads what is
        committed and two writers holding the same ETag cannot both apply (without it,
        SQLite ran the check outside any transaction and every racer won). Raise
        ``_Refused`` inside to answer without changing anything: it rolls back.
        Yields the session and the new ``config_version``.
        """
        with Session(self.engine) as s, s.begin():
            yield s, self._bump(s)

    @staticmethod
    def _bump(s: Session, key: str = "config_version") -> int:
        s.execute(update(Meta).where(Meta.key == key).values(value=Meta.value + 1))
        return s.scalar(select(Meta.value).where(Meta.key == key)) or 0

    @staticmethod
    def _audit(
        s: Session,
        *,
        actor: str,
        action: str,
        target: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        note: str | None,
        preview: dict[str, Any] | None,
    ) -> None:
        s.add(
            AuditRow(
                at=datetime.now(UTC),
                actor=actor,
                action=action,
                target=target,
                before=before,
                after=after,
                note=note,
                preview=preview,
            )
        )

    # ------------------------------------------------------------------- rules
    def put_rules(
        self,
        document: RulesDocument,
        *,
        actor: str,
        if_match: str | None,
        note: str | None,
        preview: dict[str, Any] | None,
    ) -> RulesDocument | Conflict:
        try:
            with self._admin_write() as (s, _):
                current = s.scalars(
                    select(RulesRevision).order_by(RulesRevision.revision.desc()).limit(1)
                ).one()
                if if_match is not None and if_match != rules_etag(current.revision):
                    raise _Refused(Conflict(rules_etag(current.revision)))
                now = datetime.now(UTC)
                new = RulesRevision(
                    revision=current.revision + 1,
                    document=document.rules_only(),
                    created_at=now,
                    created_by=actor,
                )
                s.add(new)
                self._audit(
                    s,
                    actor=actor,
                    action="rules.replace",
                    target="rules",
                    before={**current.document, "revision": current.revision},
                    after={**new.document, "revision": new.revision},
                    note=note,
                    preview=preview,
                )
                stored = RulesDocument.model_validate(
                    {**new.document, "revision": new.revision, "updated_at": now}
                )
        except _Refused as refused:
            return refused.result
        except IntegrityError:
            # Another writer took the same revision number first (cannot happen while
            # _admin_write serialises writers; kept as the answer if it ever does).
            return Conflict(rules_etag(self.load_config().rules.revision or 0))
        return stored

    # --------------------------------------------------------------- overrides
    def get_override(self, cluster: str) -> Override | None:
        with Session(self.engine) as s:
            row = s.get(OverrideRow, cluster)
            return None if row is None else self._override(row)

    def put_override(
        self,
        cluster: str,
        spec: OverrideSpec,
        *,
        actor: str,
        if_match: str | None,
        preview: dict[str, Any] | None,
    ) -> Override | Conflict:
        try:
            with self._admin_write() as (s, version):
                row = s.get(OverrideRow, cluster, with_for_update=True)
                current_etag = None if row is None else override_etag(cluster, row.revision)
                if if_match is not None and if_match != (current_etag or '"none"'):
                    raise _Refused(Conflict(current_etag or '"none"'))
                before = None if row is None else self._override(row).model_dump(mode="json")
                now = datetime.now(UTC)
                payload = spec.model_dump(mode="json")
                if row is None:
                    row = OverrideRow(cluster=cluster)
                    s.add(row)
                row.spec, row.created_at, row.created_by = payload, now, actor
                row.revision = version
                s.flush()
                after = self._override(row)
                self._audit(
                    s,
                    actor=actor,
                    action="override.put",
                    target=cluster,
                    before=before,
                    after=after.model_dump(mode="json"),
                    note=spec.note,
                    preview=preview,
                )
        except _Refused as refused:
            return refused.result
        return after

    def delete_override(
        self,
        cluster: str,
        *,
        actor: str,
        if_match: str | None,
        note: str | None,
        preview: dict[str, Any] | None,
    ) -> Override | Conflict | None:
        try:
            with self._admin_write() as (s, _):
                row = s.get(OverrideRow, cluster, with_for_update=True)
                if row is None:
                    raise _Refused(None)
                if if_match is not None and if_match != override_etag(cluster, row.revision):
                    raise _Refused(Conflict(override_etag(cluster, row.revision)))
                before = self._override(row)
                s.delete(row)
                self._audit(
                    s,
                    actor=actor,
                    action="override.delete",
                    target=cluster,
                    before=before.model_dump(mode="json"),
                    after=None,
                    note=note,
                    preview=preview,
                )
        except _Refused as refused:
            return refused.result
        return before

    # ------------------------------------------------------------------ tokens
    def create_token(
        self,
        *,
        token_id: str,
        name: str,
        role: str,
        clusters: Sequence[str] | None,
        secret_hash: str,
        actor: str,
    ) -> None:
        with self._admin_write() as (s, _):
            s.add(
                TokenRow(
                    id=token_id,
                    name=name,
                    role=role,
                    clusters=None if clusters is None else list(clusters),
                    secret_hash=secret_hash,
                    created_at=datetime.now(UTC),
                    created_by=actor,
                )
            )
            self._audit(
                s,
                actor=actor,
                action="token.create",
                target=name,
                before=None,
                after={"id": token_id, "name": name, "role": role, "clusters": clusters},
                note=None,
                preview=None,
            )

    def revoke_token(self, token_id: str, *, actor: str) -> bool:
        try:
            with self._admin_write() as (s, _):
                row = s.get(TokenRow, token_id, with_for_update=True)
                if row is None or row.revoked_at is not None:
                    raise _Refused(False)
                row.revoked_at = datetime.now(UTC)
                self._audit(
                    s,
                    actor=actor,
                    action="token.revoke",
                    target=row.name,
                    before={"id": row.id, "name": row.name, "role": row.role},
                    after=None,
                    note=None,
                    preview=None,
                )
        except _Refused as refused:
            return bool(refused.result)
        return True

    def count_tokens(self) -> int:
        with Session(self.engine) as s:
            return s.scalar(select(func.count()).select_from(TokenRow)) or 0

    # --------------------------------------------------------------- decisions
    def record_decisions(self, batch: Sequence[DecisionRecord]) -> None:
        """Insert a batch, its new answers, and move each pod's latest pointer, in one
        transaction.

        This is the one place that bypasses SQLAlchemy's statement compiler: rows go
        to the driver's ``executemany`` as plain tuples. At fleet boot-storm rates the
        compiler's per-row parameter processing cost more CPU (and GIL) than the
        request path itself (bench/select_load.py). The SQL is the same on SQLite and
        PostgreSQL (``ON CONFLICT`` is shared syntax); only the placeholder differs.
        """
        if not batch:
            return
        latest: dict[tuple[str, str, str], DecisionRecord] = {}
        answers: dict[str, str] = {}
        for d in batch:
            if d.answer_id not in self._known_answers and d.answer_json is not None:
                answers[d.answer_id] = d.answer_json
            if d.pod is None:
                continue  # an unnamed pod cannot be counted as one pod
            key = (d.cluster, d.node or "", d.pod)
            if key not in latest or latest[key].id < d.id:
                latest[key] = d
        ts = self._timestamp
        with self.engine.begin() as conn:
            if answers:
                # sorted, like pod_latest below: replicas writing overlapping rows in
                # the same order cannot deadlock each other on PostgreSQL
                conn.exec_driver_sql(self._sql["answers"], sorted(answers.items()))
            conn.exec_driver_sql(
                self._sql["decisions"],
                [
                    (
                        d.id,
                        ts(d.created_at),
                        d.cluster,
                        d.node,
                        d.pod,
                        d.backend,
                        d.source,
                        d.rules_revision,
                        d.request_json,
                        d.answer_id,
                    )
                    for d in batch
                ],
            )
            if latest:
                conn.exec_driver_sql(
                    self._sql["pod_latest"],
                    [
                        (c, n, p, d.id, d.backend, d.source, ts(d.created_at), d.answer_id)
                        for (c, n, p), d in sorted(latest.items())
                    ],
                )
        self._known_answers.update(answers)

    def _prepare_sql(self) -> dict[str, str]:
        mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"

        def values(n: int) -> str:
            return "(" + ", ".join([mark] * n) + ")"

        return {
            "answers": f"INSERT INTO answers (id, answer) VALUES {values(2)} "
            "ON CONFLICT (id) DO NOTHING",
            # ON CONFLICT DO NOTHING: a batch whose commit went through but whose
            # acknowledgement was lost (database restarted mid-commit) is retried by
            # the recorder; the retry must not fail forever on the primary key.
            "decisions": "INSERT INTO decisions (id, created_at, cluster, node, pod, backend, "
            f"source, rules_revision, request, answer_id) VALUES {values(10)} "
            "ON CONFLICT (id) DO NOTHING",
            "pod_latest": "INSERT INTO pod_latest (cluster, node, pod, decision_id, backend, "
            f"source, created_at, answer_id) VALUES {values(8)} "
            "ON CONFLICT (cluster, node, pod) DO UPDATE SET "
            "decision_id = excluded.decision_id, backend = excluded.backend, "
            "source = excluded.source, created_at = excluded.created_at, "
            "answer_id = excluded.answer_id "
            "WHERE excluded.decision_id > pod_latest.decision_id",
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
            return [self._decision(r) for r in s.scalars(q)]

    def get_decision(self, decision_id: str) -> DecisionRecord | None:
        with Session(self.engine) as s:
            row = s.get(DecisionRow, decision_id)
            if row is None:
                return None
            answer = s.get(AnswerRow, row.answer_id)
            return self._decision(row, None if answer is None else answer.answer)

    @staticmethod
    def _decision(r: DecisionRow, answer_json: str | None = None) -> DecisionRecord:
        return DecisionRecord(
            id=r.id,
            created_at=_aware(r.created_at),
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

    def record_failure(self, decision_id: str, backend: str, error: str) -> None:
        with Session(self.engine) as s, s.begin():
            s.add(
                FailureRow(
                    at=datetime.now(UTC), decision_id=decision_id, backend=backend, error=error
                )
            )
            self._bump(s, "evidence_version")  # a build failure is evidence too

    def failures_for(self, decision_id: str) -> list[dict[str, Any]]:
        with Session(self.engine) as s:
            return [
                {"at": _aware(f.at).isoformat(), "backend": f.backend, "error": f.error}
                for f in s.scalars(
                    select(FailureRow)
                    .where(FailureRow.decision_id == decision_id)
                    .order_by(FailureRow.id)
                )
            ]

    # ------------------------------------------------------------ measurements
    def has_report(self, report_id: str) -> bool:
        with Session(self.engine) as s:
            q = select(MeasurementRow.id).where(MeasurementRow.report_id == report_id).limit(1)
            return s.scalar(q) is not None

    def add_measurements(self, report: MeasurementReport, report_id: str) -> int:
        from mla_switchboard.core.evidence import dims_key, packages_key

        cap = report.device.capability
        m = report.model
        now = datetime.now(UTC)
        rows = [
            MeasurementRow(
                report_id=report_id,
                at=now,
                cluster=report.cluster,
                node=report.node,
                pod=report.pod,
                device_name=report.device.name or "",
                capability=None if cap is None else f"{cap[0]}.{cap[1]}",
                dims=dims_key(m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
                num_heads=m.num_heads,
                dtype=report.dtype.value,
                packages=packages_key(report.packages),
                backend=r.backend.value,
                impl=r.impl,
                shape=r.shape.model_dump_json(),
                median_ms=r.median_ms,
                tflops=r.tflops,
                correct=r.correct and r.error is None,
                error=r.error,
            )
            for r in report.results
        ]
        with Session(self.engine) as s, s.begin():
            s.add_all(rows)
            self._bump(s, "evidence_version")
        return len(rows)

    def evidence(self, since: datetime) -> list[Observation]:
        """Measured results since ``since``, plus build failures pods reported on
        decisions made since then (keyed by the situation of the failing pod)."""
        from mla_switchboard.core.evidence import Observation, Situation, situation_of
        from mla_switchboard.core.schemas import SelectRequest

        out: list[Observation] = []
        with self.engine.connect() as conn:
            q = select(
                MeasurementRow.device_name,
                MeasurementRow.capability,
                MeasurementRow.dims,
                MeasurementRow.dtype,
                MeasurementRow.packages,
                MeasurementRow.backend,
                MeasurementRow.pod,
                MeasurementRow.tflops,
                MeasurementRow.correct,
            ).where(MeasurementRow.at >= since, MeasurementRow.capability.is_not(None))
            for device, cap, dims, dtype, packages, backend, pod, tflops, correct in conn.execute(
                q
            ):
                out.append(
                    Observation(
                        situation=Situation(device, cap, dims, dtype, packages),
                        backend=backend,
                        pod=pod,
                        tflops=tflops,
                        ok=bool(correct),
                    )
                )
            failures = (
                select(FailureRow.backend, DecisionRow.request, DecisionRow.pod)
                .join(DecisionRow, DecisionRow.id == FailureRow.decision_id)
                .where(FailureRow.at >= since)
            )
            for backend, request_json, pod in conn.execute(failures):
                try:
                    situation = situation_of(SelectRequest.model_validate_json(request_json))
                except ValueError:
                    continue
                if situation is not None:
                    out.append(Observation(situation, backend, pod or "", None, ok=False))
        return out

    # ------------------------------------------------------------------- audit
    def list_audit(
        self,
        *,
        action: str | None,
        target: str | None,
        actor: str | None,
        limit: int,
        before_id: int | None,
    ) -> list[dict[str, Any]]:
        q = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
        if action is not None:
            q = q.where(AuditRow.action == action)
        if target is not None:
            q = q.where(AuditRow.target == target)
        if actor is not None:
            q = q.where(AuditRow.actor == actor)
        if before_id is not None:
            q = q.where(AuditRow.id < before_id)
        with Session(self.engine) as s:
            return [
                {
                    "id": r.id,
                    "at": _aware(r.at).isoformat(),
                    "actor": r.actor,
                    "action": r.action,
                    "target": r.target,
                    "before": r.before,
                    "after": r.after,
                    "note": r.note,
                    "preview": r.preview,
                }
                for r in s.scalars(q)
            ]


__all__ = [
    "ConfigSnapshot",
    "Conflict",
    "DecisionRecord",
    "Store",
    "TokenRecord",
    "override_etag",
    "rules_etag",
]
