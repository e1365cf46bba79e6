"""Recorded decisions: batch inserts from the recorder, listings, each pod's latest."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.service.state import DecisionRecord, PodState
from mla_switchboard.service.store.base import aware
from mla_switchboard.service.store.models import AnswerRow, DecisionRow, PodLatest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session


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
        self._sql = self._prepare_sql()
        if engine.dialect.name == "sqlite":
            # SQLAlchemy's own SQLite DateTime text format, naive UTC
            self._timestamp: Callable[[datetime], Any] = lambda d: (
                d.astimezone(UTC).replace(tzinfo=None).isoformat(" ")
            )
        else:
            self._timestamp = lambda d: d

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
