"""What every store module shares: the admin-write transaction and its version bump."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.service.store.models import Meta
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session


class Refused(Exception):
    """Raised inside ``admin_write`` to roll the write back and answer ``result``."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result


def aware(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; everything we store is UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def bump(s: Session, key: str = "config_version") -> int:
    s.execute(update(Meta).where(Meta.key == key).values(value=Meta.value + 1))
    return s.scalar(select(Meta.value).where(Meta.key == key)) or 0


@contextmanager
def admin_write(engine: Engine) -> Iterator[tuple[Session, int]]:
    """One admin write's transaction, with ``config_version`` bumped *first*.

    The bump's row lock (PostgreSQL) or write lock (SQLite) serialises admin writes
    across replicas and threads, so the If-Match check that follows reads what is
    committed and two writers holding the same ETag cannot both apply (without it,
    SQLite ran the check outside any transaction and every racer won). Raise
    ``Refused`` inside to answer without changing anything: it rolls back.
    Yields the session and the new ``config_version``.
    """
    with Session(engine) as s, s.begin():
        yield s, bump(s)
