"""``tunecache db upgrade`` / ``downgrade``: bring a database to a schema revision."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
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
    downgrade = actions.add_parser("downgrade", help="take the database back to an older revision "
                                   "(for an older server: back up the database first)")  # fmt: skip
    downgrade.add_argument("--db", metavar="URL", help="as for upgrade")
    downgrade.add_argument(
        "--revision", required=True, help="the revision an older server needs (it names it)"
    )
    downgrade.add_argument("--yes", action="store_true",
                           help="go on: what the later revisions added is dropped")  # fmt: skip
    downgrade.set_defaults(run=run_downgrade)


def run_downgrade(args: argparse.Namespace) -> int:
    from alembic.util import CommandError
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from cache_server.db import make_engine, scrubbed, shown_url
    from cache_server.migrate import current_revision, downgrade, known_revision

    url = server_settings(args).db
    unbounded = {"statement_seconds": None}
    file = make_url(url).database if make_url(url).get_backend_name() == "sqlite" else None
    if file and file != ":memory:" and not file.startswith("file:") and not Path(file).exists():
        raise InvalidInput(f"there is no database at {file}: nothing to take back")
    try:
        before = current_revision(make_engine(url, **unbounded))
        if before is None:
            raise InvalidInput(f"{shown_url(url)} has no tunecache schema: nothing to take back")
        if not known_revision(before) or not known_revision(args.revision):
            unknown = before if not known_revision(before) else args.revision
            raise InvalidInput(
                f"cannot downgrade {shown_url(url)}: this tunecache does not know revision "
                f"{unknown} (run the newest tunecache that migrated it)"
            )
        if not args.yes:
            raise InvalidInput(_undoing(url, before, args.revision))
        downgrade(url, args.revision)
        revision = current_revision(make_engine(url, **unbounded))
    except InvalidInput:
        raise
    except (SQLAlchemyError, CommandError, ValueError, OSError) as exc:
        why = scrubbed(one_line(exc), url)
        raise InvalidInput(f"cannot downgrade {shown_url(url)}: {why}") from None
    print(f"{shown_url(url)}: at revision {revision} (was revision {before})", file=sys.stderr)
    return 0


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


def _undoing(url: str, before: str, target: str) -> str:
    """What a downgrade would take out, asking for ``--yes``."""
    from cache_server.db import shown_url
    from cache_server.migrate import undone

    revisions = undone(before, target)
    if not revisions:
        return f"{shown_url(url)} is at revision {before}, not past {target}: nothing to take back"
    lines = "\n".join(f"  {line}" for line in revisions)
    return (
        f"taking {shown_url(url)} back from revision {before} to {target} takes out:\n"
        f"{lines}\nwhat they added is dropped, and not restored by upgrading again (a "
        "snapshot import's importer, a verifier's token, artifacts' copies...): back the "
        "database up, then run again with --yes"
    )
