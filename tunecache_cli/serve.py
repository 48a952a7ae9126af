"""``tunecache serve``: run the cache server in the foreground.

With ``--workers N`` (N > 1), /metrics sums all N worker processes: their counters go to files in
a private temporary directory, removed when the server stops, or, when ``PROMETHEUS_MULTIPROC_DIR``
is set, in that directory, which is left in place (see :mod:`cache_server.metrics_multiprocess`).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from typing import Any

from tunecache.errors import InvalidInput, error_message, one_line


def register(commands: Any) -> None:
    parser = commands.add_parser("serve", help="run the cache server")
    parser.add_argument("--db", metavar="URL", help="database URL (default: a SQLite file)")
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to bind (default 8765)")
    parser.add_argument("--workers", type=int, help="server processes (default 1)")
    parser.add_argument(
        "--policy",
        choices=("validated", "verified"),
        help="records served: validated by their uploader, unless disputed (default), or only "
        "those a verifier re-checked or a trusted token uploaded",
    )
    parser.add_argument(
        "--no-create",
        action="store_true",
        help="refuse to start on an empty database instead of creating the schema",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="server logs on stderr as text lines or one JSON object a line (default text)",
    )
    parser.set_defaults(run=run)


def server_settings(args: argparse.Namespace) -> Any:
    """``ServerSettings`` from the environment, overridden by the command's flags."""
    from pydantic import ValidationError

    from cache_server.settings import ServerSettings

    overrides = {k: getattr(args, k, None) for k in ("db", "host", "port", "workers", "policy")}
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return ServerSettings(**given)
    except ValidationError as exc:
        # Named as the user gave it: the flag, else the environment variable.
        def named(field: str) -> str:
            return f"--{field}" if field in given else f"TUNECACHE_SERVER_{field.upper()}"

        problems = "; ".join(f"{named('.'.join(map(str, e['loc'])))}: {error_message(e)}"
                             for e in exc.errors())  # fmt: skip
        raise InvalidInput(f"bad server setting: {problems}") from None


def _check_port(host: str, port: int) -> None:
    """Refuses, before the banner, a port something else listens on (or this user may not use).

    Raises:
        InvalidInput: naming the port and why.
    """
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            import errno

            hints = {errno.EADDRINUSE: "--port another; or stop what holds it: the workers of a "
                                       "'serve --workers N' killed with kill -9 keep serving, "
                                       "stop its process group",
                     errno.EACCES: "--port above 1023, or the right to bind this one"}  # fmt: skip
            hint = hints.get(exc.errno or 0, "--host one of this machine's addresses")
            raise InvalidInput(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} ({hint})"
            ) from None


def _prepare_database(settings: Any, *, create: bool) -> None:
    """Gives an empty database the schema (unless ``create`` is false); refuses an old one.

    Raises:
        InvalidInput: naming the database (its password hidden) and why it cannot be served.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from cache_server import SchemaOutdated
    from cache_server.db import scrubbed, shown_url
    from cache_server.migrate import prepare

    url = settings.db
    try:  # an old schema must be upgraded on purpose
        prepare(url, create=create, statement_seconds=settings.statement_seconds).dispose()
    except SchemaOutdated as exc:
        raise InvalidInput(str(exc)) from None
    except InvalidInput:
        raise
    except (SQLAlchemyError, ValueError, OSError) as exc:
        why = scrubbed(one_line(exc), url)
        raise InvalidInput(f"cannot open {shown_url(url)}: {why}") from None


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from cache_server import logs
    from cache_server.app import create_app, warn_if_public
    from cache_server.db import shown_url
    from cache_server.metrics_multiprocess import user_metrics_dir, worker_metrics_dir

    settings = server_settings(args)
    url = settings.db
    host, port = settings.host, settings.port
    _check_port(host, port)  # before the database: a port in use leaves no new database behind
    _prepare_database(settings, create=not args.no_create)
    with ExitStack() as stack:
        try:  # validated before the banner; with several workers, before uvicorn spawns them
            if settings.workers > 1:
                stack.enter_context(worker_metrics_dir())
            else:
                user_metrics_dir()
        except NotADirectoryError as exc:
            print(f"tunecache serve: {exc}", file=sys.stderr)
            return 2
        if args.log_format == "text":  # in JSON, every stderr line is a log record
            print(f"tunecache: serving {shown_url(url)} on http://{host}:{port} (OpenAPI at "
                  f"/docs); policy {settings.policy}", file=sys.stderr)  # fmt: skip
        verbose = getattr(args, "verbose", False)
        logs.configure(args.log_format, verbose=verbose)
        warn_if_public(settings)  # once, whatever the workers
        # Our access log (cache_server.access) replaces uvicorn's. uvicorn applies log_config in
        # each process it runs, so each worker of several logs as a single server does.
        # uvicorn's HTTP protocol, with a deadline for every request's headers and a cap on each
        # address's connections; no WebSocket (an upgraded connection would leave it uncounted).
        protocol = "cache_server.header_deadline:HeaderDeadline"
        log_config = logs.logging_config(args.log_format, verbose=verbose)
        options: dict[str, Any] = {"host": host, "port": port, "log_config": log_config,
                                   "log_level": "info", "access_log": False,
                                   "http": protocol, "ws": "none"}  # fmt: skip
        # A caller is its connection's address unless a proxy of the settings' forwarded it.
        proxies = settings.forwarded_allow_ips
        options.update(proxy_headers=bool(proxies), forwarded_allow_ips=proxies or None)
        if settings.workers == 1:
            uvicorn.run(create_app(settings), **options)
            return 0
        # Each worker process builds its own app (and engine) from the environment. Their
        # metrics go to files that whichever worker is scraped sums: see
        # cache_server.metrics_multiprocess for the directory.
        settings.export()
        factory = "cache_server.app:create_app"
        uvicorn.run(factory, factory=True, workers=settings.workers, **options)
    return 0
