"""Engine creation and migrations for SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


class StoreConfigError(ValueError):
    """The database URL cannot be used; the message says why and what to do."""


def make_engine(url: str) -> Engine:
    """An engine tuned for the service: WAL and a busy timeout on SQLite so the
    decision writer and admin writes don't trip over each other."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise StoreConfigError(f"SWITCHBOARD_DATABASE_URL {url!r} is not a database URL") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        db = parsed.database
        if db and db != ":memory:":
            parent = Path(db).expanduser().resolve().parent
            if not parent.is_dir():
                raise StoreConfigError(f"SQLite directory {parent} does not exist")
        engine = create_engine(url, connect_args={"timeout": 15, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=15000")
            cur.close()

        return engine
    if backend == "postgresql":
        if parsed.drivername == "postgresql":  # plain postgresql:// -> psycopg 3
            url = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
        return create_engine(url, pool_size=10, max_overflow=10, pool_pre_ping=True)
    raise StoreConfigError(
        f"unsupported database {backend!r}: use sqlite:///path or postgresql+psycopg://..."
    )


def migrate(engine: Engine) -> None:
    """Bring the schema to head. On PostgreSQL an advisory lock serialises replicas
    that start together, so only one runs the migration."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(727001)"))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
