"""Engine creation and migrations for SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
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
WRITER_SQLITE_BUSY_TIMEOUT_S = 1.0
"""How long the decision writer waits for SQLite's write lock. Short: while it waits
it is neither storing nor (once its write counts as stalled) able to retry, and
decisions wait in the spill file just as well; an admin write keeps the long timeout."""

PG_CONNECT_ARGS: dict[str, int] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,
}
"""libpq's limits for every PostgreSQL connection, unless the URL sets them. Without
them a server that stops answering (a network that drops packets, a frozen host) keeps
a connect waiting for psycopg's 130 s default and a query for as long as TCP retries,
about 15 minutes: ``connect_timeout`` (s) bounds the connect, TCP keepalives (s) find
an idle connection's peer gone in about 25 s, ``tcp_user_timeout`` (ms) drops a
connection whose sent data stays unacknowledged that long."""

WRITER_STATEMENT_TIMEOUT_MS = 10_000
WRITER_LOCK_TIMEOUT_MS = 3_000
"""The decision writer's own statements on PostgreSQL: a batch takes tens of ms, so a
statement still running after 10 s, or waiting 3 s for a lock (another replica's
writer stuck holding the fleet lock), is a fault. Failing it lets the writer retry
with backoff instead of waiting for ever; the batch stays in memory or the spill
file."""


class StoreConfigError(ValueError):
    """The database URL cannot be used; the message says why and what to do."""


def make_engine(
    url: str, *, decision_writer: bool = False, deadline_s: float | None = None
) -> Engine:
    """An engine tuned for the service: WAL and a busy timeout on SQLite so the
    decision writer and admin writes don't trip over each other; connect and TCP
    timeouts on PostgreSQL (``PG_CONNECT_ARGS``).

    ``decision_writer``: the engine of the background decision writer alone, with
    shorter waits (``WRITER_SQLITE_BUSY_TIMEOUT_S``, the ``WRITER_*_TIMEOUT_MS``
    statement limits) and a pool of its own, so that a write stuck on a hung
    database holds none of the connections admin writes and reads need.

    ``deadline_s``: how long a request waits for a store call (``store/deadline.py``).
    On PostgreSQL it also bounds the wait for a pooled connection (``pool_timeout``,
    30 s otherwise). SQLite keeps its busy timeout: replicas starting together on one
    file wait that long for each other's migration, and a request's call past the
    deadline is abandoned (and its statements refused) anyway."""
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
        if decision_writer:
            timeout = min(timeout, WRITER_SQLITE_BUSY_TIMEOUT_S)
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
        connect_args = _pg_connect_args(parsed.query, decision_writer=decision_writer)
        size = 2 if decision_writer else 10  # the writer makes one call at a time
        pool: dict[str, Any] = {} if deadline_s is None else {"pool_timeout": deadline_s}
        return _engine(
            url,
            pool_size=size,
            max_overflow=size,
            pool_pre_ping=True,
            connect_args=connect_args,
            **pool,
        )
    raise StoreConfigError(
        f"unsupported database {backend!r}: use sqlite:///path or postgresql+psycopg://..."
    )


def make_writer_engine(url: str, main: Engine) -> Engine:
    """The decision writer's engine (``make_engine(decision_writer=True)``); ``main``
    itself for an in-memory SQLite database, which a second engine would not share."""
    if main.dialect.name == "sqlite" and (main.url.database or ":memory:") == ":memory:":
        return main
    return make_engine(url, decision_writer=True)


def _pg_connect_args(query: Mapping[str, Any], *, decision_writer: bool) -> dict[str, Any]:
    """``PG_CONNECT_ARGS`` less what the URL's query sets (the operator's choice wins;
    SQLAlchemy would otherwise let these override the URL), and for the writer its
    statement limits put before the URL's own ``options`` (a later ``-c`` wins)."""
    args: dict[str, Any] = {k: v for k, v in PG_CONNECT_ARGS.items() if k not in query}
    if decision_writer:
        given = query.get("options", "")
        given = " ".join(given) if isinstance(given, tuple) else given
        limits = (
            f"-c statement_timeout={WRITER_STATEMENT_TIMEOUT_MS} "
            f"-c lock_timeout={WRITER_LOCK_TIMEOUT_MS}"
        )
        args["options"] = f"{limits} {given}".strip()
    return args


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
