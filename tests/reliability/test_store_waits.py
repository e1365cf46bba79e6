"""How long a store call may wait: the limits ``service/store/db.py`` gives connections,
checked against real databases (a SQLite file, the shared PostgreSQL in a schema of the
test's own, a listener that never answers).

A database that hangs rather than refuses must not hold the decision drainer for ever
(the decision log keeps every decision meanwhile: ``test_outage.py``, with a frozen
PostgreSQL).
"""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from pathlib import Path

import psycopg
import pytest
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.db import (
    PG_CONNECT_ARGS,
    WRITER_LOCK_TIMEOUT_MS,
    make_engine,
    make_writer_engine,
    migrate,
)
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from tests.reliability.conftest import row

pytestmark = pytest.mark.serial


def _stores(url: str) -> tuple[Store, Engine, Engine]:
    main = make_engine(url)
    writer = make_writer_engine(url, main)
    migrate(main)
    store = Store(main, decision_writer=writer)
    store.config.ensure_seeded()
    return store, main, writer


def _record_in_thread(store: Store, wait_s: float) -> tuple[bool, BaseException | None, float]:
    """``record_rows`` of one decision on a thread: did it end within ``wait_s``, how,
    and after how long (a call that never ends must not hang the test)."""
    outcome: list[BaseException | None] = []
    start = time.monotonic()

    def call() -> None:
        try:
            store.decisions.record_rows([row(1)])
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(wait_s)
    return bool(outcome), outcome[0] if outcome else None, time.monotonic() - start


def test_the_sqlite_writer_gives_up_on_a_lock_long_before_admin_writes(tmp_path: Path) -> None:
    """Before: the writer shared the 15 s busy timeout of admin writes, and a write
    waiting on SQLite's lock stored nothing all that time."""
    db = tmp_path / "sb.db"
    url = f"sqlite:///{db}?timeout=8"
    store, main, writer = _stores(url)
    try:
        with writer.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 1000
        with main.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 8000
        locker = sqlite3.connect(db, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            ended, error, took = _record_in_thread(store, 20)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert ended and isinstance(error, OperationalError), error
        assert "locked" in str(error)
        assert took < 8 / 2, took  # the writer's 1 s, not the URL's 8 s
        store.decisions.record_rows([row(2)])  # and the lock gone, it writes again
    finally:
        writer.dispose()
        main.dispose()


@pytest.mark.postgres
def test_the_postgres_writer_has_statement_limits_and_keeps_the_url_options(
    pg_url_factory: object,
) -> None:
    """The writer's connections carry a statement and a lock timeout (set in the
    connection's ``options``, after the URL's own search_path); every connection has
    libpq's connect and TCP limits. A lock held by a stuck session (here: another
    session holding the fleet lock for ever) fails the writer's batch after the lock
    timeout instead of holding it for as long as the holder lives."""
    url = pg_url_factory()  # type: ignore[operator]
    schema = url.rsplit("%3D", 1)[1]
    store, main, writer = _stores(url)
    try:
        with writer.connect() as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "10s"
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "3s"
            assert conn.exec_driver_sql("SHOW search_path").scalar() == schema
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        for key, value in PG_CONNECT_ARGS.items():
            assert params.get(key) == str(value), (key, params)
        with main.connect() as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "0"
        with main.connect() as holder:
            holder.exec_driver_sql(
                f"SELECT pg_advisory_lock(hashtext('{schema}' || ':fleet_counts'))"
            )
            ended, error, took = _record_in_thread(store, 30)
            holder.exec_driver_sql("SELECT pg_advisory_unlock_all()")
            holder.commit()
        # the fleet lock is taken through psycopg directly (the COPY path): unwrapped
        assert ended and isinstance(error, psycopg.OperationalError), error
        assert "lock timeout" in str(error)
        assert took >= WRITER_LOCK_TIMEOUT_MS / 1000 * 0.9
        store.decisions.record_rows([row(2)])
    finally:
        writer.dispose()
        main.dispose()

    overridden = make_engine(url + "&connect_timeout=7&keepalives_idle=30")
    try:
        with overridden.connect() as conn:
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        assert params["connect_timeout"] == "7" and params["keepalives_idle"] == "30"
        assert params["tcp_user_timeout"] == str(PG_CONNECT_ARGS["tcp_user_timeout"])
    finally:
        overridden.dispose()


@pytest.mark.postgres
def test_a_server_that_accepts_and_never_answers_fails_the_connect() -> None:
    """The kernel completes the TCP handshake for a listener that never reads (a frozen
    server): before, psycopg waited its 130 s default; now ``connect_timeout``."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        engine = make_engine(f"postgresql+psycopg://postgres@127.0.0.1:{port}/test")
        start = time.monotonic()
        try:
            with pytest.raises(OperationalError, match="timeout"):
                engine.connect()
        finally:
            engine.dispose()
        took = time.monotonic() - start
    limit = PG_CONNECT_ARGS["connect_timeout"]
    print(f"\nconnect to a server that never answers: failed after {took:.1f} s")
    assert took < 3 * limit < 130, took
