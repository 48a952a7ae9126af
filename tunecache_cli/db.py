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
    upgrade.add_argument("--db", metavar="URL",
                         help="database URL (default: $TUNECACHE_SERVER_DB, else the SQLite file "
                              "in the user cache directory); ps shows it: with a password, set "
                              "TUNECACHE_SERVER_DB instead")  # fmt: skip
    upgrade.add_argument("--revision", default="head", help="target revision (default: head)")
    upgrade.set_defaults(run=run_upgrade)


def run_upgrade(args: argparse.Namespace) -> int:
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from cache_server import SchemaOutdated
    from cache_server.db import make_engine, scrubbed, shown_url
    from cache_server.migrate import current_revision, known_revision, past, upgrade

    url = server_settings(args).db
    unbounded = {"statement_seconds": None}  # a migration's tool waits for what it needs
    try:
        before = current_revision(make_engine(url, **unbounded))
        newer = before is not None and not known_revision(before)
        if not newer:
            upgrade(url, args.revision)
        revision = current_revision(make_engine(url, **unbounded))
    except SchemaOutdated as exc:  # tables without a revision
        raise InvalidInput(f"cannot upgrade {shown_url(url)}: {exc}") from None
    except (SQLAlchemyError, CommandError, ValueError, OSError) as exc:  # ValueError: a bad URL
        why = scrubbed(one_line(exc), url)  # CommandError: a --revision it does not know
        raise InvalidInput(f"cannot upgrade {shown_url(url)}: {why}") from None
    if newer:
        raise InvalidInput(f"cannot upgrade {shown_url(url)}: it is at revision {before}, which "
                           "a newer tunecache made (upgrades never go back)")  # fmt: skip
    if revision == before and past(before, args.revision):
        print(f"{shown_url(url)}: at revision {revision}, already past {args.revision}; nothing "
              "done (an upgrade never goes back)", file=sys.stderr)  # fmt: skip
        return 0
    was = "an empty database" if before is None else f"revision {before}"
    print(f"{shown_url(url)}: at revision {revision} (was {was})", file=sys.stderr)
    return 0
