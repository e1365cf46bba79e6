"""The tables. The same definitions run on SQLite (embedded default) and PostgreSQL;
the schema itself is created and evolved by the Alembic migrations in
``service/migrations`` (these models must stay in step with them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from mla_switchboard.core.engines import OWN_ENGINE
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    false,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class RulesRevision(Base):
    """Append-only: every rules write is a new revision; the newest is in force."""

    __tablename__ = "rules_revisions"
    revision: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    document: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_by: Mapped[str] = mapped_column(String(100))


class OverrideRow(Base):
    __tablename__ = "overrides"
    cluster: Mapped[str] = mapped_column(String(63), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_by: Mapped[str] = mapped_column(String(100))
    revision: Mapped[int] = mapped_column(Integer)


class DecisionRow(Base):
    __tablename__ = "decisions"
    id: Mapped[str] = mapped_column(String(26), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    cluster: Mapped[str] = mapped_column(String(63))
    node: Mapped[str | None] = mapped_column(String(253))
    pod: Mapped[str | None] = mapped_column(String(253))
    backend: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(32))
    rules_revision: Mapped[int] = mapped_column(Integer)
    # The request is the pod's cluster, node and name here plus its shape (everything
    # else it sent), stored once per distinct shape: thousands of pods of one kind
    # send the same description. Rows written before shapes existed keep their whole
    # request as JSON text in ``request`` and have no shape.
    request: Mapped[str | None] = mapped_column(Text, nullable=True)
    shape_id: Mapped[str | None] = mapped_column(String(24), nullable=True)
    answer_id: Mapped[str] = mapped_column(String(24))
    # who asked (``rows.Decision``): None on rows written before it was kept
    principal: Mapped[str | None] = mapped_column(String(80), nullable=True)
    verified: Mapped[bool] = mapped_column(Boolean, server_default=false(), default=False)

    __table_args__ = (
        Index("ix_decisions_cluster_id", "cluster", "id"),
        Index("ix_decisions_backend_id", "backend", "id"),
        # one pod's decisions, newest first: evidence checks and the pod filter
        Index("ix_decisions_cluster_pod_id", "cluster", "pod", "id"),
    )


class AnswerRow(Base):
    """Answers by content hash: a rollout's thousands of pods share a handful."""

    __tablename__ = "answers"
    id: Mapped[str] = mapped_column(String(24), primary_key=True)
    answer: Mapped[str] = mapped_column(Text)


class ShapeRow(Base):
    """A request without its cluster, node and pod name, by content hash (canonical JSON):
    the part of a request that decides everything but the pod's stage bucket."""

    __tablename__ = "shapes"
    id: Mapped[str] = mapped_column(String(24), primary_key=True)
    request: Mapped[str] = mapped_column(Text)


class PodLatest(Base):
    """Each pod's newest decision: the fleet table lists it, ``fleet_counts`` counts it."""

    __tablename__ = "pod_latest"
    cluster: Mapped[str] = mapped_column(String(63), primary_key=True)
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    pod: Mapped[str] = mapped_column(String(253), primary_key=True)
    decision_id: Mapped[str] = mapped_column(String(26))
    backend: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    answer_id: Mapped[str] = mapped_column(String(24))
    shape_id: Mapped[str | None] = mapped_column(String(24), nullable=True)
    # core/stages.py: the pod's stage bucket, a function of (cluster, pod) only
    bucket: Mapped[int | None] = mapped_column(Integer, nullable=True)

    # pods not seen for a while leave the live fleet, oldest first (fleet/expiry.py)
    __table_args__ = (Index("ix_pod_latest_created_at", "created_at"),)


class FleetCount(Base):
    """How many pods' newest decision is in each group: (cluster, shape, backend,
    source), with the same count split over the 100 stage buckets (JSON list).

    Kept in step with ``pod_latest`` by the decision writer, in the same transaction
    and under one lock, so every fleet read (summary, regret, previews, rollout
    progress) costs O(clusters x situations), never O(pods)."""

    __tablename__ = "fleet_counts"
    cluster: Mapped[str] = mapped_column(String(63), primary_key=True)
    shape_id: Mapped[str] = mapped_column(String(24), primary_key=True)
    backend: Mapped[str] = mapped_column(String(32), primary_key=True)
    source: Mapped[str] = mapped_column(String(32), primary_key=True)
    pods: Mapped[int] = mapped_column(Integer)
    buckets: Mapped[str] = mapped_column(Text)


class TokenRow(Base):
    __tablename__ = "tokens"
    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    role: Mapped[str] = mapped_column(String(16))
    clusters: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_by: Mapped[str] = mapped_column(String(100))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class AuditRow(Base):
    __tablename__ = "audit"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    actor: Mapped[str] = mapped_column(String(100))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(100))
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    note: Mapped[str | None] = mapped_column(Text, nullable=True)
    preview: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # a rollout guard's entry: the failure or halt it is about, as data (core/causes.py)
    cause: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class FailureRow(Base):
    __tablename__ = "failures"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    decision_id: Mapped[str] = mapped_column(String(26), index=True)
    backend: Mapped[str] = mapped_column(String(32))
    error: Mapped[str] = mapped_column(Text)
    # set when an admin clears a situation's failures (POST /v1/measurements/failures/clear)
    cleared_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class EvidenceClearRow(Base):
    """One admin's clear of a situation's failures (one backend, or all: ``backend``
    null), written in the clear's own transaction: every replica reads new rows here
    and forgets those failures in place, instead of rebuilding all its evidence."""

    __tablename__ = "evidence_clears"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    device_name: Mapped[str] = mapped_column(String(253))
    capability: Mapped[str] = mapped_column(String(8))
    dims: Mapped[str] = mapped_column(String(32))
    dtype: Mapped[str] = mapped_column(String(16))
    packages: Mapped[str] = mapped_column(Text)
    engine: Mapped[str] = mapped_column(String(80))
    backend: Mapped[str | None] = mapped_column(String(32), nullable=True)


class IdempotencyRow(Base):
    """The answer an admin write gave, by the caller's ``Idempotency-Key``: written in the
    write's own transaction, so a retry after a lost answer finds either nothing (the
    write did not happen) or exactly what the first request was told."""

    __tablename__ = "idempotency_keys"
    # the id of the token that sent the key (the bootstrap token's: BOOTSTRAP_ID); the
    # column kept its first name, which held the token's name, shared by other tokens
    actor: Mapped[str] = mapped_column(String(100), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class RefusedSelectRow(Base):
    """Selects refused for their token, counted per claimed cluster, reason and hour:
    a fleet whose secret is mistyped shows up here instead of only in pods' logs."""

    __tablename__ = "refused_selects"
    cluster: Mapped[str] = mapped_column(String(63), primary_key=True)
    reason: Mapped[str] = mapped_column(String(64), primary_key=True)
    hour: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    count: Mapped[int] = mapped_column(Integer)
    last_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class GuardPendingRow(Base):
    """A report whose rollout guard has not been evaluated yet, written before the
    report is stored and removed once its guard ran: any replica's step waits while one
    is left, and evaluates it once its own replica had time to (service/rollouts.py)."""

    __tablename__ = "guard_pending"
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    payload: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Meta(Base):
    """``config_version`` is bumped by every admin write so replicas notice it cheaply."""

    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class MeasurementRow(Base):
    """One backend on one shape, measured on a pod's own GPU.

    The situation columns (device, capability, dims, dtype, packages) are what
    measured selection matches a pod's request against; ``packages`` is canonical
    JSON so that equal package sets compare equal in SQL and in memory.
    """

    __tablename__ = "measurements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    report_id: Mapped[str] = mapped_column(String(26), index=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    cluster: Mapped[str] = mapped_column(String(63))
    node: Mapped[str | None] = mapped_column(String(253), nullable=True)
    pod: Mapped[str] = mapped_column(String(253))
    device_name: Mapped[str] = mapped_column(String(253))
    capability: Mapped[str | None] = mapped_column(String(8), nullable=True)
    dims: Mapped[str] = mapped_column(String(32))
    num_heads: Mapped[int | None] = mapped_column(Integer, nullable=True)
    dtype: Mapped[str] = mapped_column(String(16))
    packages: Mapped[str] = mapped_column(Text)
    backend: Mapped[str] = mapped_column(String(32))
    impl: Mapped[str | None] = mapped_column(String(100), nullable=True)
    shape: Mapped[str] = mapped_column(Text)
    median_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    correct: Mapped[bool] = mapped_column(Boolean)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # the serving engine whose code path was measured: "switchboard" or "vllm 0.33.0"
    engine: Mapped[str] = mapped_column(String(80), server_default=OWN_ENGINE)
    cleared_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # Counted as evidence: the reporting pod has a recorded decision in this cluster
    # for the same situation. Reports that do not are kept, not counted.
    counted: Mapped[bool] = mapped_column(Boolean, server_default=true())

    # the wrong results alone (a fraction of a percent): a load that starts from an
    # evidence snapshot reads them all again, and a clear finds them, without the rest
    __table_args__ = (
        Index(
            "ix_measurements_wrong_id",
            "id",
            postgresql_where=text("correct = false"),
            sqlite_where=text("correct = false"),
        ),
    )


class EvidenceSnapshotRow(Base):
    """What a replica's evidence counted from the measurement rows up to
    ``measurement_id`` (except the ``gaps``: ids below it not visible then), as
    ``core.evidence.snapshot`` encodes it: a start restores the newest one and reads
    only the rows after it."""

    __tablename__ = "evidence_snapshots"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    made_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    per_pod: Mapped[int] = mapped_column(Integer)
    measurement_id: Mapped[int] = mapped_column(BigInteger)
    gaps: Mapped[list[Any]] = mapped_column(JSON)
    pods: Mapped[int] = mapped_column(Integer)
    # empty when kept in ``parts`` rows (EvidenceSnapshotPartRow); 0 parts: all in here
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    parts: Mapped[int] = mapped_column(Integer, server_default=text("0"))


class EvidenceSnapshotPartRow(Base):
    """One part of an evidence snapshot (``core.evidence.snapshot.encode_parts``): a
    few hundred KB, read one at a time, so that no block the size of the whole
    snapshot is ever allocated. Dropped with its snapshot by the store."""

    __tablename__ = "evidence_snapshot_parts"
    snapshot_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary)


class PersonSessionRow(Base):
    """A person's signed-in session (service/identity/people.py). Keyed by the SHA-256 of the
    cookie's random id, so a copy of the table signs no one in; any replica finds it.
    ``groups`` are what the provider last said (the mapping is applied to them on every
    request); role and clusters what the mapping gave at sign-in (sessions from before
    groups were kept use them). The refresh token asks the provider again; it is of use
    only with the client's secret, which the database does not hold."""

    __tablename__ = "person_sessions"
    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    subject: Mapped[str] = mapped_column(String(255))
    email: Mapped[str | None] = mapped_column(String(320), nullable=True)
    role: Mapped[str] = mapped_column(String(16))
    clusters: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    groups: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    refresh_token: Mapped[str | None] = mapped_column(Text, nullable=True)
    access_token: Mapped[str | None] = mapped_column(Text, nullable=True)
    checked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
