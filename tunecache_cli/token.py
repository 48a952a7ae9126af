"""``tunecache token create|list|revoke``: API tokens, through the server or on the database.

Through the server (the default; ``--server`` or ``$TUNECACHE_URL``) every action needs an
``admin`` token in ``$TUNECACHE_TOKEN``. With ``--db [URL]`` they act on the database directly
(the server's database when no URL is given): that is how the first admin token is made.

``create`` prints the token alone on stdout, so ``export TUNECACHE_TOKEN=$(tunecache token create
…)`` works; it is never shown again. Exit 0 done, 1 refused by the server or no such token, 2 bad
input, 3 server unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from tunecache.errors import InvalidInput, ServerError, error_message, one_line
from tunecache.schemas import MAX_ID
from tunecache.tokens import (
    SCOPES,
    TokenCreate,
    TokenCreated,
    TokenPublic,
    TokenRevoked,
    byte_size,
    grants,
    name_text,
)
from tunecache_cli.args import add_server, server_url
from tunecache_cli.table import counted, render, shown


def register(commands: Any) -> None:
    parser = commands.add_parser("token", help="create, list and revoke API tokens")
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a token (printed once, on stdout)")
    create.add_argument("--name", required=True, help="who or what holds it, e.g. ci or gpu-node-3")
    create.add_argument("--scope", required=True, help=f"one of {', '.join(SCOPES)}")
    create.add_argument(
        "--trusted", action="store_true",
        help="its uploads are served as verified at once (the verified policy)",
    )  # fmt: skip
    create.set_defaults(run=run_create)
    listing = actions.add_parser("list", help="list tokens (never the tokens themselves)")
    listing.add_argument("--all", action="store_true", help="include revoked tokens")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(run=run_list)
    revoke = actions.add_parser("revoke", help="revoke a token by its id")
    revoke.add_argument("token_id", type=int, metavar="ID")
    revoke.add_argument(
        "--withdraw", action="store_true",
        help="also take its records out of service until another verifier checks each: its "
        "uploads and imports no verifier passed, and a verify token's passes and rejections "
        "(for a token that leaked; may follow a revocation)",
    )  # fmt: skip
    revoke.set_defaults(run=run_revoke)
    whoami = actions.add_parser("whoami", help="the token in $TUNECACHE_TOKEN, as the server "
                                "sees it: name, scope, what it has stored")  # fmt: skip
    whoami.add_argument("--json", action="store_true", help="print JSON")
    add_server(whoami)
    whoami.set_defaults(run=run_whoami)
    for action in (create, listing, revoke):
        add_server(action)
        action.add_argument(
            "--db",
            nargs="?",
            const="",
            metavar="URL",
            help="act on this database directly, not through a server "
            "(no URL: $TUNECACHE_SERVER_DB or the default SQLite file)",
        )


class _Direct:
    """The token actions on a database, in one transaction."""

    def __init__(self, session: Any, where: str, policy: str) -> None:
        self.session, self.where = session, where  # where: the database's URL, no password
        self.policy = policy  # the server's: whether a withdrawn record's key is still served

    def create_token(self, name: str, scope: str, *, trusted: bool = False) -> TokenCreated:
        from cache_server import tokens

        try:
            token, row = tokens.create(self.session, name=name, scope=scope,  # type: ignore[arg-type]
                                       trusted=trusted)  # fmt: skip
        except tokens.NameTaken as exc:  # bad input: exit 2, naming the clash
            raise InvalidInput(f"--name: {exc}") from None
        return TokenCreated(token=token, info=tokens.public(row))

    def list_tokens(self, *, include_revoked: bool = False) -> list[TokenPublic]:
        from cache_server import tokens

        return tokens.list_tokens(self.session, include_revoked=include_revoked)

    def revoke_token(self, token_id: int, *, withdraw: bool = False) -> TokenRevoked:
        from cache_server import tokens

        try:
            revoked = tokens.revoke(self.session, token_id=token_id, withdraw=withdraw,
                                    policy=self.policy)  # fmt: skip
        except tokens.LastAdmin as exc:  # as the server answers it: 409, exit 1
            raise ServerError(str(exc), status_code=409) from None
        if revoked is None:  # as the server answers it: 404, exit 1
            raise ServerError(f"no token {token_id}", status_code=404)
        return revoked


@contextmanager
def _tokens(args: argparse.Namespace, *, create: bool = False) -> Iterator[Any]:
    """A client of the server, or a :class:`_Direct` on the database when ``--db`` was given,
    made first if ``create`` (else a mistyped SQLite path is refused: ``token list`` said "no
    tokens" and left an empty database behind).

    Raises:
        InvalidInput: both ``--server`` and ``--db`` were given (``--db`` won, without a word).
    """
    if args.db is not None and args.server:
        raise InvalidInput("give one of --server and --db: a token is made through a server or "
                           "in a database, not both")  # fmt: skip
    if args.db is None:
        from tunecache.client import Client
        from tunecache_cli.progress import asking

        url = server_url(args)
        with Client(url) as client, asking(f"token {args.action}", url):
            yield client
        return
    from sqlalchemy.exc import SQLAlchemyError

    from cache_server import SchemaOutdated
    from cache_server.db import make_sessionmaker
    from cache_server.migrate import prepare
    from tunecache_cli.serve import server_settings

    args.db = args.db or None  # bare --db: the server's own setting
    new: list[bool] = []
    try:
        settings = server_settings(args)
        engine = prepare(settings.db, create=create, statement_seconds=settings.statement_seconds,
                         created=lambda: new.append(True))  # fmt: skip
        with make_sessionmaker(engine).begin() as session:
            yield _Direct(session, engine.url.render_as_string(hide_password=True),
                          settings.policy)  # fmt: skip
    except SchemaOutdated as exc:
        raise InvalidInput(str(exc)) from None
    except SQLAlchemyError as exc:
        raise InvalidInput(f"cannot use the database: {one_line(exc)}") from None
    if new:  # a shell without the server's TUNECACHE_SERVER_DB made a database of its own
        where = engine.url.render_as_string(hide_password=True)
        print(f"tunecache: {where} was a new database, made now. A server on this database "
              "knows the token; one started on another (`serve --db URL`, "
              "$TUNECACHE_SERVER_DB) does not: give its URL to --db", file=sys.stderr)  # fmt: skip


def run_create(args: argparse.Namespace) -> int:
    try:
        request = TokenCreate(name=args.name, scope=args.scope, trusted=args.trusted)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(f"--{first['loc'][0]}: {error_message(first)}") from None
    with _tokens(args, create=True) as tokens:
        try:
            created: TokenCreated = tokens.create_token(request.name, request.scope,
                                                        trusted=request.trusted)  # fmt: skip
        except ServerError as exc:  # a live token's name: bad input, as with --db (exit 2)
            if exc.status_code != 409:
                raise
            raise InvalidInput(f"--name: {exc}") from None
        where = getattr(tokens, "where", None) or server_url(args)
    info = created.info
    trusted = ", trusted (its uploads are served as verified)" if info.trusted else ""
    print(
        f"created token {info.id} {_named(info.name)} with the {info.scope!r} scope{trusted} in "
        f"{where}; it is shown only now:",
        file=sys.stderr,
    )
    print(created.token)
    return 0


def _named(name: str) -> str:
    """A token's name in a sentence: quoted, in ASCII where no new token may be so named (a
    server is not trusted: ``'аdmin'`` with a Cyrillic а read as the team's admin token)."""
    return repr(name) if name_text(name) == name else name_text(name)


def run_list(args: argparse.Namespace) -> int:
    with _tokens(args) as tokens:
        items: list[TokenPublic] = tokens.list_tokens(include_revoked=args.all)
    if args.json:
        print(json.dumps([item.model_dump(mode="json") for item in items], indent=2))
        return 0

    def when(moment: Any) -> str:
        return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M")

    def stored(size: int | None) -> str:  # None: a server that counts none
        return "-" if size is None else byte_size(size)

    header = ("id", "name", "scope", "trusted", "token", "created", "last used", "revoked",
              "stored")  # fmt: skip
    rows = [
        (t.id, name_text(t.name), t.scope, "yes" if t.trusted else "-", f"{t.prefix}…",
         when(t.created_at), when(t.last_used_at), when(t.revoked_at), stored(t.stored_bytes))
        for t in items
    ]  # fmt: skip
    print(render(header, rows) if rows else "no tokens")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    if not 1 <= args.token_id <= MAX_ID:  # bad input, as records show says it (exit 2)
        raise InvalidInput(f"ID {args.token_id}: a token ID is a whole number from 1 to {MAX_ID}")
    with _tokens(args) as tokens:
        info: TokenRevoked = tokens.revoke_token(args.token_id, withdraw=args.withdraw)
    said = f"revoked token {info.id} {_named(info.name)}"
    if args.withdraw and info.withdrawn is None:  # a server before withdrawals ignored it
        print(
            f"{said}, but withdrew none of its records: the server does not know --withdraw "
            "(an older version); its records stay served until disputed",
            file=sys.stderr,
        )
        return 1
    verifier = grants(info.scope, "verify")  # its findings stand on its word too
    # A verify token's rejections were out of service already: withdrawn, each is checked again.
    then = ("each checked again by another verifier (out of service until it passes)" if verifier
            else "out of service until another verifier checks each")  # fmt: skip
    if args.withdraw:
        on_its_word = VERIFIERS_WORD if verifier else "served on its word alone"
        said += (
            f"; withdrew {counted(info.withdrawn or 0, 'record')} {on_its_word}: disputed, {then}"
        )
    if info.standing:
        on_its_word = (f"still {VERIFIERS_WORD}" if verifier
                       else "that no verifier passed still served on its word alone")  # fmt: skip
        standing = counted(info.standing, "record")
        said += (f"; {standing} {on_its_word}: if it leaked, revoking it again "
                 f"with --withdraw disputes them, {then}")  # fmt: skip
    if info.artifacts:  # what its tune --torch, tune --tvm and enable() shared: gone silently
        said += (f"; its {counted(info.artifacts, 'shared artifact')} (Inductor's choices, "
                 "MetaSchedule's records, fused-MoE files: `tunecache artifacts ls`) are served "
                 "no more, but where another token holds a copy")  # fmt: skip
    print(said, file=sys.stderr)
    return 0


VERIFIERS_WORD = (
    "standing on its word (its uploads no verifier passed, its passes and rejections as a verifier)"
)


def run_whoami(args: argparse.Namespace) -> int:
    """Exit 0 with a token the server knows, 1 without one (reads alone, where they are open)."""
    from tunecache.client import Client
    from tunecache.tokens import byte_size
    from tunecache_cli.progress import asking

    url = server_url(args)
    with Client(url) as client, asking("token whoami", url):
        me = client.whoami()
    if args.json:
        print(json.dumps(me.model_dump(mode="json"), indent=2))
        return 0 if me.token else 1
    reads = "open to anyone" if me.reads == "open" else "for tokens only"
    if me.token is None:
        print(f"no token (none in $TUNECACHE_TOKEN); {url}'s reads are {reads}")
        return 1
    t = me.token
    stored = "" if t.stored_bytes is None else f"; stored {byte_size(t.stored_bytes)}"
    print(
        shown(
            f"token {t.id} {_named(t.name)} ({t.prefix}...), scope {t.scope}"
            f"{', trusted' if t.trusted else ''}{stored}; {url}'s reads are {reads}"
        )
    )
    return 0
