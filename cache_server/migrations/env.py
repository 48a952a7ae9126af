"""Alembic environment: runs migrations on the connection or URL the caller configured, under
the migration lock (:func:`cache_server.migrate.migration_lock`)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from cache_server.db import make_engine
from cache_server.migrate import check_versioned, migration_lock
from cache_server.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    with migration_lock(connection):
        check_versioned(connection)  # under the lock: what another run left is visible
        if connection.in_transaction() and not config.attributes.get("connection"):
            connection.commit()  # the check's reads: Alembic begins a transaction of its own
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    # Unbounded: the API's bound on a statement (cache_server.db.make_engine) would cut a
    # migration of a large table, and a wait for a table the server holds.
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "", statement_seconds=None)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
