"""Schema management through Alembic only: upgrade, and the start-up check.

The server never calls ``create_all``: it refuses to start unless the database is at the head
revision and holds every column and index of the models (:func:`missing_schema`), and names the
command that upgrades (or repairs) it. On PostgreSQL an upgrade holds an advisory
lock for its whole run (:func:`migration_lock`), so servers and ``db upgrade`` runs started
together on one database take turns: the first migrates, the others find the schema current.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Final

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from cache_server import SchemaOutdated

MIGRATIONS = Path(__file__).with_name("migrations")
# pg_advisory_lock's key for migrations: "tunecach" in ASCII, a fixed 64-bit number no other
# lock of the database uses.
MIGRATION_LOCK_KEY: Final = 0x74756E6563616368
# Tables every revision has: one of them without a revision means the version table was lost.
_OUR_TABLES: Final = ("records", "trials", "winners")
# The migration that adds what migrations edited after their release left out (check_schema's
# advice for a database at the head that lacks some of it: going back below it drops nothing).
_REPAIR: Final = "0018"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def head_revision() -> str:
    head = _scripts().get_current_head()
    assert head is not None
    return head


def known_revision(revision: str) -> bool:
    """Whether this code's migrations hold ``revision`` (a database a newer version migrated is
    at one they do not)."""
    from alembic.util import CommandError

    try:
        return _scripts().get_revision(revision) is not None
    except CommandError:
        return False


def past(current: str | None, target: str) -> bool:
    """Whether a database at ``current`` is already beyond ``target``: an upgrade to it does
    nothing (Alembic's upgrade never goes back, and says nothing of it). ``False`` for a target
    that is not one revision (``head``, ``+1``) or that this code does not know."""
    from alembic.util import CommandError

    if current is None or current == target:
        return False
    try:
        wanted = _scripts().get_revision(target)
        if wanted is None:
            return False
        below = _scripts().iterate_revisions(current, "base")
        return any(r.revision == wanted.revision for r in below if r.revision != current)
    except CommandError:
        return False


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade_command(url: str, action: str = "upgrade") -> str:
    """The ``tunecache db upgrade`` command (or ``db ACTION``) for ``url``, as one can paste it:
    the URL on the command line when it holds no password, else in ``TUNECACHE_SERVER_DB`` with
    a placeholder where the password goes (``***``, pasted, was taken for the password)."""
    parsed = make_url(url)
    if parsed.password is None:
        return f"tunecache db {action} --db {shlex.quote(url)}"
    shown = parsed.render_as_string(hide_password=True).replace(":***@", ":PASSWORD@", 1)
    return (f"TUNECACHE_SERVER_DB={shlex.quote(shown)} tunecache db {action} "
            "(PASSWORD: the database's, left out here)")  # fmt: skip


def upgrade(url: str, revision: str = "head") -> None:
    """Brings the database at ``url`` to ``revision`` (creating it when empty).

    Raises:
        SchemaOutdated: the database holds tunecache's tables but no revision.
    """
    command.upgrade(alembic_config(url), revision)


def undone(current: str, target: str) -> list[str]:
    """The revisions a downgrade from ``current`` to ``target`` takes out, newest first, each
    with what it added (its docstring's first paragraph, as plain text, cut at a word: the
    first line of it stopped mid-sentence, its markup raw)."""
    revisions = _scripts().iterate_revisions(current, target)
    return [f"{r.revision}: {_summary(r.doc or '')}" for r in revisions
            if r.revision != target]  # fmt: skip


def _summary(doc: str, width: int = 160) -> str:
    text = " ".join(doc.split("\n\n")[0].split()).replace("``", "")
    return text if len(text) <= width else text[: text.rfind(" ", 0, width - 1)] + "…"


def downgrade(url: str, revision: str) -> None:
    """Takes the database at ``url`` back to ``revision`` (each migration's ``downgrade``, the
    newest first): what an older server needs after a newer one migrated it.

    Raises:
        alembic.util.CommandError: ``revision`` is not one this code knows.
    """
    command.downgrade(alembic_config(url), revision)


@contextmanager
def migration_lock(connection: Connection) -> Iterator[None]:
    """Holds PostgreSQL's advisory lock for migrations on ``connection`` (elsewhere, nothing).

    Without it, three servers started at once on one empty database each created the schema:
    two failed with ``duplicate key value violates unique constraint "pg_type_typname_nsp_index"``
    (and from revision 0010, one with Alembic's "expected to match one row"). A waiter then
    reads the revision the first one left. Held for the session and given back at the end; on
    a connection already in a transaction (the caller's), until that transaction ends.
    """
    if connection.dialect.name != "postgresql":
        yield
        return
    key = {"key": MIGRATION_LOCK_KEY}
    if connection.in_transaction():
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), key)
        yield
        return
    connection.execute(text("SELECT pg_advisory_lock(:key)"), key)
    connection.commit()  # so that Alembic begins (and commits) its own transaction
    try:
        yield
    finally:
        with suppress(SQLAlchemyError):  # a broken connection: its end gave the lock back
            if connection.in_transaction():
                connection.rollback()
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), key)
            connection.commit()


def check_versioned(connection: Connection) -> None:
    """Raises :class:`SchemaOutdated` when the database holds tunecache's tables but no revision
    (``alembic_version`` missing or empty): migrating it from nothing failed with
    ``DuplicateTable: relation "records" already exists``."""
    if MigrationContext.configure(connection).get_current_revision() is not None:
        return
    present = [t for t in _OUR_TABLES if inspect(connection).has_table(t)]
    if present:
        raise SchemaOutdated(
            f"the database holds tunecache's tables ({', '.join(present)}) but no schema "
            "revision (its alembic_version table is missing or empty), so it cannot be "
            "upgraded: restore alembic_version from the backup it came from (one row, the "
            "revision the tables were made at), or start from an empty database"
        )


def prepare(url: str, *, create: bool = True, statement_seconds: float | None = None,
            created: Callable[[], None] | None = None) -> Engine:  # fmt: skip
    """An engine on ``url`` at the head revision: an empty database gets the schema (unless
    ``create`` is false), and ``created`` is called then; one at an older revision raises
    :class:`SchemaOutdated`, for it must be upgraded on purpose. ``statement_seconds``: the
    engine's bound (:func:`cache_server.db.make_engine`; the server's setting, 0 behind
    PgBouncer)."""
    from cache_server.db import make_engine

    parsed = make_url(url)
    file = parsed.database if parsed.get_backend_name() == "sqlite" else None
    uri = file is not None and (file.startswith("file:") or "uri" in parsed.query)
    if not create and file and file != ":memory:" and not uri and not Path(file).exists():
        # Connecting would leave an empty file behind, a database that is not there.
        raise SchemaOutdated(f"there is no database at {file}; create it with: "
                             f"{upgrade_command(url)}")  # fmt: skip
    engine = make_engine(url, statement_seconds=statement_seconds)
    if create and current_revision(engine) is None:
        upgrade(url)
        if created is not None:
            created()
    check_schema(engine)
    return engine


def missing_schema(connection: Connection) -> list[str]:
    """The models' tables, columns and indexes (an index: by name, columns and uniqueness) the
    database lacks, as ``column jobs.strategy``, ``index ix_winners_record_id on winners
    (record_id)``. The revision alone does not say: migrations 0004, 0005, 0007 and 0015 were
    edited after they were released, and a database one of their first versions migrated
    reached the head without what the edits added (500s on jobs and artifacts). What the
    database holds beyond the models is not asked. Two reflection queries on PostgreSQL, a few
    pragmas per table on SQLite: read once, at start-up."""
    from cache_server.models import Base

    tables = Base.metadata.sorted_tables
    inspector = inspect(connection)
    names = [t.name for t in tables]
    live_columns = inspector.get_multi_columns(filter_names=names)
    live_indexes = inspector.get_multi_indexes(filter_names=names)
    missing: list[str] = []
    for table in tables:
        columns = {c["name"] for c in live_columns.get((None, table.name), [])}
        if not columns:
            missing.append(f"table {table.name}")
            continue
        missing += [f"column {table.name}.{c.name}" for c in table.columns if c.name not in columns]
        indexes = {i["name"]: (i["column_names"], bool(i["unique"]))
                   for i in live_indexes.get((None, table.name), [])}  # fmt: skip
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            wanted = [c.name for c in index.columns]
            if indexes.get(str(index.name)) != (wanted, bool(index.unique)):
                unique = "unique " if index.unique else ""
                missing.append(f"{unique}index {index.name} on {table.name} ({', '.join(wanted)})")
    return missing


def check_schema(engine: Engine) -> None:
    """Raises :class:`SchemaOutdated` unless the database is at the head revision and holds
    every column and index the models name (:func:`missing_schema`)."""
    current, head = current_revision(engine), head_revision()
    if current == head:
        with engine.connect() as conn:
            missing = missing_schema(conn)
        if missing:
            raise SchemaOutdated(_incomplete(engine, head, missing))
        return
    if current is not None and not known_revision(current):
        raise SchemaOutdated(
            f"the database is at revision {current}, which a newer tunecache made: this one "
            f"knows revisions up to {head} (upgrades never go back); run the newer version, or "
            f"take the database back with it: tunecache db downgrade --revision {head}"
        )
    if current is None:
        with engine.connect() as conn:
            check_versioned(conn)
    state = "has no tunecache schema" if current is None else f"is at revision {current}"
    url = engine.url.render_as_string(hide_password=False)
    raise SchemaOutdated(
        f"the database {state}; this server needs revision {head}. Run: {upgrade_command(url)}"
    )


def _incomplete(engine: Engine, head: str, missing: list[str]) -> str:
    """What :func:`check_schema` says of a database at ``head`` that lacks ``missing``."""
    url = engine.url.render_as_string(hide_password=False)
    repair = _scripts().get_revision(_REPAIR)
    assert repair is not None
    back = upgrade_command(url, f"downgrade --revision {repair.down_revision} --yes")
    return (
        f"the database is at revision {head} but lacks what this server needs: "
        f"{'; '.join(missing)}. Migration {_REPAIR} adds the columns and indexes that "
        f"migrations edited after their release left out; to run it again: {back}, then: "
        f"{upgrade_command(url)}. One it does not add was taken out by hand: restore it from "
        "a backup."
    )
