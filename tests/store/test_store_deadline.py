"""A request's store calls against a real SQLite file held locked by another
connection (a store that does not answer): each is abandoned at the deadline with an
outcome the answer can state, and an abandoned write never lands afterwards."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import pytest
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.db import make_engine, migrate
from mla_switchboard.service.store.deadline import StoreDeadline, StoreTimeout, store_deadline
from sqlalchemy import event

T = TypeVar("T")

DEADLINE_S = 0.3


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[Store, StoreDeadline, Path]]:
    db = tmp_path / "sb.db"
    engine = make_engine(f"sqlite:///{db}?timeout=3")
    migrate(engine)
    deadline = StoreDeadline(DEADLINE_S, workers=4)
    store = Store(engine, deadline=deadline)
    store.config.ensure_seeded()
    yield store, deadline, db
    deadline.close()
    engine.dispose()


def _create(store: Store, name: str) -> None:
    store.tokens.create_token(
        token_id=f"id-{name}", name=name, role="viewer", clusters=None, secret_hash=f"h-{name}",
        actor="test",
    )  # fmt: skip


def _names(store: Store) -> set[str]:
    with store.engine.connect() as conn:
        return {r[0] for r in conn.exec_driver_sql("SELECT name FROM tokens")}


def test_outside_a_request_calls_run_as_before(
    stores: tuple[Store, StoreDeadline, Path],
) -> None:
    store, _, _ = stores
    _create(store, "plain")  # no request served: not bounded, not on a worker
    assert "plain" in _names(store)


def test_a_write_on_a_locked_store_is_abandoned_and_never_lands(
    stores: tuple[Store, StoreDeadline, Path],
) -> None:
    store, deadline, db = stores
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with deadline.serving("POST"), pytest.raises(StoreTimeout) as caught:
            _create(store, "late")
        assert not caught.value.outcome_unknown
        assert "nothing was changed" in caught.value.message
        assert caught.value.retry_after_s >= 1
        assert deadline.outliving == 1
        with deadline.serving("GET"):  # readers are not blocked by a writer (WAL)
            store.audit.list_audit(action=None, target=None, actor=None, limit=5, before_id=None)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    # the lock gone, the abandoned call goes on: its next statement is refused
    deadline_at = time.monotonic() + 5
    while deadline.outliving and time.monotonic() < deadline_at:
        time.sleep(0.02)
    assert deadline.outliving == 0
    assert "late" not in _names(store)
    audit = store.audit.list_audit(action=None, target=None, actor=None, limit=50, before_id=None)
    assert not [e for e in audit if "late" in str(e)]  # no audit entry either
    with deadline.serving("POST"):
        _create(store, "after")  # and the store answers again
    assert "after" in _names(store)


@pytest.mark.serial
def test_a_write_on_a_locked_store_is_abandoned_at_the_deadline(
    stores: tuple[Store, StoreDeadline, Path],
) -> None:
    """Not before the deadline (the store had its time), not long after (the request
    is answered): a wall-clock bound, so it runs alone."""
    store, deadline, db = stores
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with deadline.serving("POST"):
            start = time.monotonic()
            with pytest.raises(StoreTimeout):
                _create(store, "late")
            took = time.monotonic() - start
        assert DEADLINE_S <= took < DEADLINE_S + 1, took
    finally:
        locker.execute("ROLLBACK")
        locker.close()


class _ClockFromCommit(StoreDeadline):
    """A deadline counted from the moment the commit is sent: the statements before it
    take what they take (seconds on a busy machine), and the commit alone outlives it."""

    def __init__(self, deadline_s: float, reached: threading.Event) -> None:
        super().__init__(deadline_s, workers=2)
        self.reached = reached

    def _await(self, future: Future[T], wait_s: float) -> T:
        self.reached.wait(60)
        return future.result(wait_s)


def test_a_commit_already_sent_is_said_to_be_unknown(tmp_path: Path) -> None:
    """A commit that outlives the deadline may land: the answer must not say it did not."""
    reached, released = threading.Event(), threading.Event()
    engine = make_engine(f"sqlite:///{tmp_path / 'sb.db'}?timeout=3")
    migrate(engine)
    deadline = _ClockFromCommit(DEADLINE_S, reached)
    store = Store(engine, deadline=deadline)
    store.config.ensure_seeded()

    def held_commit(_: object) -> None:  # sent, and held until the caller gave up
        reached.set()
        released.wait(60)

    event.listen(store.engine, "commit", held_commit)
    try:
        with deadline.serving("POST"), pytest.raises(StoreTimeout) as caught:
            _create(store, "maybe")
        released.set()
        assert caught.value.outcome_unknown
        assert "may or may not have been applied" in caught.value.message
        until = time.monotonic() + 30
        while deadline.outliving and time.monotonic() < until:
            time.sleep(0.02)
        assert "maybe" in _names(store)  # here it did land
    finally:
        released.set()
        event.remove(store.engine, "commit", held_commit)
        deadline.close()
        engine.dispose()


def test_an_in_memory_database_gets_no_worker_threads() -> None:
    """Its one connection belongs to the thread that opened it."""
    engine = make_engine("sqlite://")
    try:
        assert store_deadline(engine, 4.0) is None
    finally:
        engine.dispose()
