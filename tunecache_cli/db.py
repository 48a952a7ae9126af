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
    from sqlalchemy.exc import SQLAlchemyError

    from cache_server.db import make_engine, scrubbed, shown_url
    from cache_server.migrate import current_revision, upgrade

    url = server_settings(args).db
    try:
        upgrade(url, args.revision)
        revision = current_revision(make_engine(url))
    except (SQLAlchemyError, ValueError, OSError) as exc:  # ValueError: a malformed URL
        why = scrubbed(one_line(exc), url)
        raise InvalidInput(f"cannot upgrade {shown_url(url)}: {why}") from None
    print(f"{shown_url(url)}: at revision {revision}", file=sys.stderr)
    return 0
