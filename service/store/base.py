"""What every store module shares: the admin-write transaction and its version bump."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from mla_switchboard.service.store.models import IdempotencyRow, Meta
from sqlalchemy import Engine, Select, Update, delete, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session


class Refused(Exception):
    """Raised inside ``admin_write`` to roll the write back and answer ``result``."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result


def aware(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; everything we store is UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def newest_first(
    q: Select[Any],
    id_column: Any,
    *,
    limit: int,
    before_id: object | None,
    equal: Iterable[tuple[Any, object | None]],
) -> Select[Any]:
    """A page of a log, newest first (the audit trail, the decisions): at most ``limit``
    rows with an id below ``before_id`` (None: from the newest), and each column of
    ``equal`` equal to its value (a value of None: any)."""
    q = q.order_by(id_column.desc()).limit(limit)
    for column, value in equal:
        if value is not None:
            q = q.where(column == value)
    if before_id is not None:
        q = q.where(id_column < before_id)
    return q


def bump_statement(key: str) -> Update:
    """The statement that moves version ``key`` of the ``meta`` table by one: how every
    writer tells the other replicas (they poll these rows) that something changed."""
    return update(Meta).where(Meta.key == key).values(value=Meta.value + 1)


def bump(s: Session, key: str = "config_version") -> int:
    s.execute(bump_statement(key))
    return s.scalar(select(Meta.value).where(Meta.key == key)) or 0


class OutcomeUnknown(Exception):
    """The database failed while committing: the write may or may not be stored. A
    caller that sent an ``Idempotency-Key`` retries with it and learns which."""


@dataclass(frozen=True)
class Replayed:
    """An earlier request with the same ``Idempotency-Key``: what it was answered, or
    ``same_request`` False when that key came with a different request."""

    status: int
    body: dict[str, Any]
    same_request: bool


@dataclass(frozen=True)
class Idempotency:
    """A write's ``Idempotency-Key``, kept under ``owner``, the id of the token that sent
    it (not its name, which other tokens may share): ``respond`` makes the answer to
    keep from what the write stored (inside its transaction)."""

    owner: str
    key: str
    request_hash: str
    respond: Callable[[Any], tuple[int, dict[str, Any]]]

    def recall(self, s: Session) -> Replayed | None:
        row = s.get(IdempotencyRow, (self.owner, self.key))
        if row is None:
            return None
        return Replayed(row.status, json.loads(row.body), row.request_hash == self.request_hash)

    def keep(self, s: Session, stored: Any) -> None:
        status, body = self.respond(stored)
        s.add(
            IdempotencyRow(
                actor=self.owner,
                key=self.key,
                request_hash=self.request_hash,
                status=status,
                body=json.dumps(body, default=str),
                created_at=datetime.now(UTC),
            )
        )


IDEMPOTENCY_TTL = timedelta(hours=24)


def recall_idempotency(
    engine: Engine, owner: str, key: str, request_hash: str | None = None
) -> Replayed | None:
    """What a write with this key of token ``owner`` was answered, outside any write
    (None: not used); ``same_request`` compares ``request_hash`` when one is given."""
    with Session(engine) as s:
        row = s.get(IdempotencyRow, (owner, key))
        if row is None:
            return None
        same = request_hash is None or row.request_hash == request_hash
        return Replayed(row.status, json.loads(row.body), same)


@contextmanager
def admin_write(
    engine: Engine, idempotency: Idempotency | None = None
) -> Iterator[tuple[Session, int]]:
    """One admin write's transaction, with ``config_version`` bumped *first*.

    The bump's row lock (PostgreSQL) or write lock (SQLite) serialises admin writes
    across replicas and threads, so the If-Match check that follows reads what is
    committed and two writers holding the same ETag cannot both apply (without it,
    SQLite ran the check outside any transaction and every racer won). Raise
    ``Refused`` inside to answer without changing anything: it rolls back. With an
    ``idempotency`` key already used, the write is refused with what the first one
    was answered (``Replayed``), under the same lock, so two racing retries apply
    once. A failure at commit raises ``OutcomeUnknown``: unlike a failure before it,
    the change may be stored. Yields the session and the new ``config_version``.
    """
    with Session(engine) as s:
        s.begin()
        version = bump(s)
        if idempotency is not None:
            s.execute(
                delete(IdempotencyRow).where(
                    IdempotencyRow.created_at < datetime.now(UTC) - IDEMPOTENCY_TTL
                )
            )
            replayed = idempotency.recall(s)
            if replayed is not None:
                s.rollback()
                raise Refused(replayed)
        try:
            yield s, version
        except BaseException:
            s.rollback()
            raise
        try:
            s.commit()
        except SQLAlchemyError as exc:
            raise OutcomeUnknown(str(exc)) from exc
