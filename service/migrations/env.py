"""Alembic environment: run by ``service.store.db.migrate`` with a live connection,
or by the ``alembic`` command with ``-x url=...``.

It imports nothing of the live code: a migration means what it meant when it was
written. Autogenerating a revision needs the models' metadata: pass it as
``config.attributes["target_metadata"]`` (``service.store.models.Base.metadata``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

config = context.config
target_metadata = config.attributes.get("target_metadata")


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    engine = create_engine(url)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
