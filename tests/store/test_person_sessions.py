"""People's sessions in the store, on SQLite and PostgreSQL: one replica writes a
session, another finds it by the hash of its id until it expires; sign-out deletes it
for both; a sign-in deletes the rows that have expired."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from mla_switchboard.service.store import Store
from sqlalchemy import Engine, text


def test_sessions_across_replicas(store: Store, engines: Callable[[], Engine]) -> None:
    other = Store(engines())
    now = datetime.now(UTC)
    hour = timedelta(hours=1)
    store.sessions.add_session(
        "a" * 64, subject="alice", email="alice@example.com", role="admin",
        clusters=["prod-*"], created_at=now, expires_at=now + hour,
    )  # fmt: skip
    store.sessions.add_session(
        "b" * 64, subject="bob", email=None, role="viewer",
        clusters=None, created_at=now, expires_at=now + timedelta(seconds=1),
    )  # fmt: skip
    found = other.sessions.find_session("a" * 64, now)
    assert found is not None
    assert (found.subject, found.email, found.role, found.clusters) == (
        "alice", "alice@example.com", "admin", ("prod-*",),
    )  # fmt: skip
    assert found.expires_at == now + hour
    assert other.sessions.find_session("b" * 64, now + timedelta(seconds=2)) is None
    assert other.sessions.find_session("c" * 64, now) is None

    assert other.sessions.delete_session("a" * 64)
    assert store.sessions.find_session("a" * 64, now) is None
    later = now + timedelta(seconds=5)
    store.sessions.add_session(
        "c" * 64, subject="carol", email=None, role="viewer",
        clusters=None, created_at=later, expires_at=later + hour,
    )  # fmt: skip
    with store.engine.connect() as db:
        kept = db.execute(text("SELECT id_hash FROM person_sessions")).scalars().all()
    assert kept == ["c" * 64]  # bob's expired row went with carol's sign-in
