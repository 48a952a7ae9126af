"""Schema management through Alembic only: upgrade, and the start-up check.

The server never calls ``create_all``: it refuses to start unless the database is at the head
revision, and names the command that upgrades it.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from cache_server import SchemaOutdated

MIGRATIONS = Path(__file__).with_name("migrations")
UPGRADE_COMMAND = "tunecache db upgrade --db {url}"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def known_revision(revision: str) -> bool:
    """Whether this code's migrations hold ``revision`` (a database a newer version migrated is
    at one they do not)."""
    from alembic.util import CommandError

    try:
        return (
            ScriptDirectory.from_config(alembic_config("sqlite://")).get_revision(revision)
            is not None
        )
    except CommandError:
        return False


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(url: str, revision: str = "head") -> None:
    """Brings the database at ``url`` to ``revision`` (creating it when empty)."""
    command.upgrade(alembic_config(url), revision)


def prepare(url: str, *, create: bool = True) -> Engine:
    """An engine on ``url`` at the head revision: an empty database gets the schema (unless
    ``create`` is false); one at an older revision raises :class:`SchemaOutdated`, for it must be
    upgraded on purpose."""
    from sqlalchemy.engine import make_url

    from cache_server.db import make_engine

    parsed = make_url(url)
    file = parsed.database if parsed.get_backend_name() == "sqlite" else None
    uri = file is not None and (file.startswith("file:") or "uri" in parsed.query)
    if not create and file and file != ":memory:" and not uri and not Path(file).exists():
        # Connecting would leave an empty file behind, a database that is not there.
        raise SchemaOutdated(f"there is no database at {file}; create it with: "
                             f"{UPGRADE_COMMAND.format(url=url)}")  # fmt: skip
    engine = make_engine(url)
    if create and current_revision(engine) is None:
        upgrade(url)
    check_schema(engine)
    return engine


def check_schema(engine: Engine) -> None:
    """Raises :class:`SchemaOutdated` unless the database is at the head revision."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        url = engine.url.render_as_string(hide_password=True)
        if current is not None and not known_revision(current):
            raise SchemaOutdated(
                f"the database is at revision {current}, which a newer tunecache made: this one "
                f"knows revisions up to {head} (upgrades never go back); run the newer version"
            )
        state = "has no tunecache schema" if current is None else f"is at revision {current}"
        raise SchemaOutdated(
            f"the database {state}; this server needs revision {head}. "
            f"Run: {UPGRADE_COMMAND.format(url=url)}"
        )
