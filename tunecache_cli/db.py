"""``tunecache db upgrade``: bring a database to the server's schema revision."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tunecache.errors import InvalidInput, one_line
from tunecache_cli.serve import server_settings


def register(commands: Any) -> None:
    parser = commands.add_parser("db", help="database schema management")
    actions = parser.add_subparsers(dest="action", required=True)
    upgrade = actions.add_parser("upgrade", help="migrate the database to the latest revision")
    upgrade.add_argument("--db", metavar="URL", help="database URL (default: the SQLite file)")
    upgrade.add_argument("--revision", default="head", help="target revision (default: head)")
    upgrade.set_defaults(run=run_upgrade)


def run_upgrade(args: argparse.Namespace) -> int:
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from cache_server.db import make_engine, scrubbed, shown_url
    from cache_server.migrate import current_revision, known_revision, upgrade

    url = server_settings(args).db
    try:
        before = current_revision(make_engine(url))
        newer = before is not None and not known_revision(before)
        if not newer:
            upgrade(url, args.revision)
        revision = current_revision(make_engine(url))
    except (SQLAlchemyError, CommandError, ValueError, OSError) as exc:  # ValueError: a bad URL
        why = scrubbed(one_line(exc), url)  # CommandError: a --revision it does not know
        raise InvalidInput(f"cannot upgrade {shown_url(url)}: {why}") from None
    if newer:
        raise InvalidInput(f"cannot upgrade {shown_url(url)}: it is at revision {before}, which "
                           "a newer tunecache made (upgrades never go back)")  # fmt: skip
    was = "an empty database" if before is None else f"revision {before}"
    print(f"{shown_url(url)}: at revision {revision} (was {was})", file=sys.stderr)
    return 0
