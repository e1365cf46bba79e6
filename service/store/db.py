"""Engine creation and migrations for SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from mla_switchboard.service.messages import first_line, shown_url
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 15.0


class StoreConfigError(ValueError):
    """The database URL cannot be used; the message says why and what to do."""


def make_engine(url: str) -> Engine:
    """An engine tuned for the service: WAL and a busy timeout on SQLite so the
    decision writer and admin writes don't trip over each other."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise StoreConfigError(
            f"SWITCHBOARD_DATABASE_URL {shown_url(url)!r} is not a database URL"
        ) from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        db = parsed.database
        if db and db != ":memory:":
            parent = Path(db).expanduser().resolve().parent
            if not parent.is_dir():
                raise StoreConfigError(f"SQLite directory {parent} does not exist")
        # How long a write waits for another connection's lock before failing with
        # "database is locked" (503 for an admin write); ``?timeout=S`` in the URL.
        try:
            timeout = float(parsed.query.get("timeout", SQLITE_BUSY_TIMEOUT_S))  # type: ignore[arg-type]
        except ValueError:
            raise StoreConfigError(f"SQLite ?timeout= in {url!r} is not a number") from None
        engine = _engine(url, connect_args={"timeout": timeout, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            _into_wal(cur, timeout)
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            cur.close()

        return engine
    if backend == "postgresql":
        if parsed.drivername == "postgresql":  # plain postgresql:// -> psycopg 3
            url = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
        return _engine(url, pool_size=10, max_overflow=10, pool_pre_ping=True)
    raise StoreConfigError(
        f"unsupported database {backend!r}: use sqlite:///path or postgresql+psycopg://..."
    )


def _engine(url: str, **options: Any) -> Engine:
    """``create_engine``, with its refusals (an unknown driver such as
    ``postgresql+bogus``, a bad option) said as a StoreConfigError without the password."""
    try:
        return create_engine(url, **options)
    except ArgumentError as exc:
        raise StoreConfigError(
            f"SWITCHBOARD_DATABASE_URL {shown_url(url)!r} cannot be used: {first_line(exc)}"
        ) from exc


def _into_wal(cursor: Any, timeout_s: float) -> None:
    """``PRAGMA journal_mode=WAL``, retried while another process holds the lock.

    Turning a new file to WAL needs an exclusive lock, and SQLite answers "database is
    locked" at once there rather than through the busy handler: replicas starting
    together on a fresh file would otherwise fail at their first connection."""
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.25)


def migrate(engine: Engine) -> None:
    """Bring the schema to head; safe when several processes start together.

    PostgreSQL: an advisory lock serialises replicas, so only one runs the migration.
    SQLite: ``BEGIN IMMEDIATE`` takes the database's write lock first (pysqlite would
    otherwise run the DDL outside any transaction, and two processes starting on a
    fresh file would both create the tables), and a no-op write proves the file is
    writable: a read-only database fails here, at start, with a clear message, rather
    than later on every decision.
    """
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    sqlite = engine.dialect.name == "sqlite"
    try:
        with engine.begin() as conn:
            if sqlite:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.execute(text("SELECT pg_advisory_xact_lock(727001)"))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            if sqlite:
                conn.exec_driver_sql("UPDATE alembic_version SET version_num = version_num")
    except OperationalError as exc:
        if sqlite:
            raise StoreConfigError(_sqlite_problem(engine, exc)) from exc
        raise


def _sqlite_problem(engine: Engine, exc: OperationalError) -> str:
    """What an operator needs to read when SQLite refuses to start."""
    path = engine.url.database or ":memory:"
    code = getattr(exc.orig, "sqlite_errorname", "")
    detail = str(exc.orig).splitlines()[0] if exc.orig is not None else str(exc)
    if code.startswith("SQLITE_READONLY"):
        return (
            f"SQLite database {path} is read-only ({detail}): the service writes every "
            "decision; make the file, its -wal/-shm files and its directory writable by "
            "this user, or point SWITCHBOARD_DATABASE_URL elsewhere"
        )
    if code.startswith("SQLITE_BUSY") or "locked" in detail:
        timeout = engine.url.query.get("timeout", SQLITE_BUSY_TIMEOUT_S)
        return (
            f"SQLite database {path} is locked by another process ({detail}, waited "
            f"{timeout}s); stop whatever holds it (a sqlite3 shell in a transaction, a "
            "backup) and start again"
        )
    if code.startswith("SQLITE_CANTOPEN"):
        return (
            f"cannot open SQLite database {path} ({detail}): its directory must exist "
            "and be writable by this user (SQLite creates the -wal and -shm files there)"
        )
    return f"SQLite database {path} cannot be used: {detail}"
