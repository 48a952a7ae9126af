"""The ``tunecache`` command line.

Exit codes: 0 success (a hit for ``get``), 1 a miss or a failed run, 2 bad input (a server that is
not tunecache, or one that refuses the request as malformed, included), 3 the server could not be
reached, 4 the server refused the token (401, 403), 130 interrupted, 141 the reader of stdout
left (``| head``).
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from tunecache import __version__
from tunecache.errors import InvalidInput, ServerError, SourcesChanged, TuningError, one_line
from tunecache_cli import (
    artifacts,
    best,
    coverage,
    daemon,
    db,
    demo,
    get,
    imports,
    pretune,
    progress,
    push,
    records,
    replay,
    report,
    serve,
    snapshot,
    sync,
    token,
    tune,
    workloads,
)

EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_REFUSED = 4
# The reader of stdout left (`… | head`): what a shell reports for a process SIGPIPE ended, not
# 1, a miss's (records show of an ID that exists read as one that does not).
EXIT_BROKEN_PIPE = 128 + 13
BAD_REQUEST = (400, 413, 422)  # the server found the request (the user's input) malformed
COMMANDS = (
    serve, db, token, tune, get, best, records, artifacts, replay, workloads, demo, snapshot, sync,
    imports, daemon, pretune, coverage, report, push,
)  # fmt: skip


class _Parser(argparse.ArgumentParser):
    argv: ClassVar[list[str]] = []  # the command line being parsed (main sets it)

    def error(self, message: str) -> None:  # type: ignore[override]
        unknown = self._unknown_options()
        if unknown and message.startswith("the following arguments are required"):
            # A mistyped flag: "--shpae M=8" said only that --shape is required
            message = f"unrecognized arguments: {' '.join(unknown)} ({message})"
        parsing = self._parsing()
        hints = [f"{option}: did you mean {', '.join(close)}?" for option in unknown
                 if (close := difflib.get_close_matches(option, parsing._option_string_actions,
                                                        n=2, cutoff=0.7))]  # fmt: skip
        hints += self._command_hints(message)
        said = f"{message}; {'; '.join(hints)}" if hints else message
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {said}\n")

    def _commands(self) -> dict[str, argparse.ArgumentParser]:
        """This parser's commands (``records`` has ``ls``, ``show`` …), none where it has none."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    def _parsing(self) -> argparse.ArgumentParser:
        """The parser of the command this command line names, however deep (``records ls``):
        unrecognized arguments are said by the root, which knows none of a command's options."""
        parser: argparse.ArgumentParser = self
        for arg in self.argv:
            if arg == "--":
                break
            commands = parser._commands() if isinstance(parser, _Parser) else {}
            if arg in commands:
                parser = commands[arg]
        return parser

    def _command_hints(self, message: str) -> list[str]:
        """'did you mean get?' for a mistyped command (``tunecache gett``)."""
        commands = self._commands()
        if not message.startswith("argument ") or "invalid choice: " not in message:
            return []
        typed = message.partition("invalid choice: ")[2].partition(" (")[0].strip("'\"")
        close = difflib.get_close_matches(typed, commands, n=2, cutoff=0.6)
        return [f"{typed}: did you mean {', '.join(close)}?"] if close else []

    def _unknown_options(self) -> list[str]:
        """The ``--options`` of this command line that the command's parser has none of."""
        parsing = self._parsing()
        known = {*parsing._option_string_actions, "--verbose", "--version", "--help"}  # and root's
        before = self.argv[: self.argv.index("--")] if "--" in self.argv else self.argv
        given = dict.fromkeys(arg.partition("=")[0] for arg in before if arg.startswith("--"))
        # An option argparse takes for a known one (a unique prefix: --back is --backend) is no
        # typo
        return [
            option
            for option in given
            if option not in known and sum(k.startswith(option) for k in known) != 1
        ]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tunecache",
        description="Tune kernels, validate the winners, serve them from a shared cache.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    parser.add_argument("--version", action="version", version=f"tunecache {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS:
        module.register(commands)
    return parser


def user_path() -> None:
    """Makes a kernel of the user's project (``package.module:Class``) importable from the current
    directory, after our packages: a folder of theirs named like one of ours (``tuner/``,
    ``backends/``) never stands in for it, here or in the worker processes spawned from here
    (they inherit this path).

    An editable install finds our packages through an import hook that Python asks only after
    every path entry, so the folder that holds them is put on the path too, before the current
    directory, which moves to the end (``python -m`` puts it first).
    """
    here = os.getcwd()
    ours = str(Path(__file__).resolve().parents[1])  # the folder holding tunecache/, tuner/ ...
    kept = [p for p in sys.path if p not in ("", here, ours)]
    sys.path[:] = [*kept, ours, here]


def _nobody_there(exc: ServerError) -> str:
    """A hint when nothing listens at the server's address (a connection refused), or what does
    closes without an HTTP answer (PostgreSQL's port given for the server's)."""
    cause = exc.__cause__
    if exc.status_code is None and "connection refused" in str(cause).lower():
        return " (is `tunecache serve` running there, and is the URL right?)"
    if exc.status_code is None and (
        "disconnected without sending a response" in str(cause) or "reset by peer" in str(cause)
    ):
        return " (is it an HTTP server: a database's port, say, not `tunecache serve`'s?)"
    return ""


def _token_refused(exc: ServerError) -> str:
    """Where a server refused the token the client named (401: the client's error says which
    token, and where), how to make one it knows."""
    said = str(exc)
    if exc.status_code != 401 or exc.foreign or "token create" in said or "no token" in said:
        return ""
    return ("; make one it knows on its machine: `tunecache token create --db [URL] --name NAME "
            "--scope SCOPE`, URL its --db")  # fmt: skip


def server_exit(exc: ServerError) -> int:
    """The exit code of a server's error, as docs/cli.md gives them: 3 unreachable, unavailable
    (503: busy, or its database down; 429: over its rate limit: both say try again) or an answer
    that does not read as one (no status: a broken or hostile tunecache server); 2 an answer that
    is not a tunecache server's, or a request the server found malformed (400, 413, 422: the CLI
    built it from the user's arguments and files), or a 404 for a path no route of the server has
    (the URL's path is wrong: a script reading 1, a miss, would tune again); 4 the token refused
    (401, 403); 1 anything else (404: a miss; 409, other 5xx; an upload of a tuned record
    refused)."""
    from tunecache_cli.outbox import UploadRefused

    if exc.status_code is None:
        return EXIT_UNREACHABLE
    if exc.foreign:  # whatever it answered: the URL is wrong
        return EXIT_BAD_INPUT
    if exc.status_code in (429, 503):  # busy, its database down, or over its rate limit: later
        return EXIT_UNREACHABLE
    if exc.status_code in (401, 403):
        return EXIT_REFUSED
    if exc.status_code in BAD_REQUEST and not isinstance(exc, UploadRefused):
        return EXIT_BAD_INPUT
    if exc.no_route:  # the URL's path is wrong (…:8765/v1): never read as a miss
        return EXIT_BAD_INPUT
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the exit code."""
    parser = build_parser()
    _Parser.argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command is None:  # bare `tunecache`: what it can do
        parser.print_help()
        return 0
    user_path()
    progress.command_started()  # no printer is silent 5 s past the start or its last line
    when = "%(asctime)s " if getattr(args, "log_times", False) else ""  # a daemon's lines
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format=f"{when}%(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S%z",  # local time, its offset named
    )
    try:
        code: int = args.run(args)
    except InvalidInput as exc:
        print(f"tunecache: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ServerError as exc:  # what a server said, on one line
        from tunecache_cli.table import shown

        hint = _nobody_there(exc) or _token_refused(exc)
        print(f"tunecache: error: {shown(str(exc))}{hint}", file=sys.stderr)
        return server_exit(exc)
    except SourcesChanged as exc:  # an idle daemon too: "tuning failed" would be untrue
        print(f"tunecache: stopped: {exc}", file=sys.stderr)
        return 1
    except TuningError as exc:
        print(f"tunecache: tuning failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        from tunecache_cli.interrupt import EXIT_INTERRUPTED, say_interrupted

        say_interrupted()  # once: the watcher of a tune may have said it (tunecache_cli.interrupt)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `tunecache … | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # a bug of ours: one line, the traceback only when asked for
        if args.verbose:
            raise
        print(f"tunecache: internal error: {one_line(exc)} (run with -v for the traceback)",
              file=sys.stderr)  # fmt: skip
        return 1
    finally:
        progress.command_started(False)
    return code


def entry() -> None:
    sys.exit(main())
