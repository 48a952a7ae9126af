"""``tunecache push``: send what a tune could not upload (its record, or the artifacts of ``tune
--torch`` and ``tune --tvm``; the outbox, :mod:`tunecache_cli.outbox`) to the server they were
tuned for.

Exit 0 when nothing waits any more for that server (uploads another process is sending now are
said, not waited for), 1 when some were refused or unreadable (moved to the outbox's
``rejected/``, each unreadable file named; one ``rejected/`` could not take stays, said in a
warning naming it) or could not be sent, 2 bad input (an outbox folder refused: another user's,
or open to others' writes), 3 the server could not be reached, 4 it refused the token.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tunecache.errors import InvalidInput, ServerError
from tunecache.settings import Settings, outbox_dir
from tunecache_cli.args import add_server, preflight, server_url


def register(commands: Any) -> None:
    parser = commands.add_parser("push", help="send what a tune could not upload (the outbox)")
    add_server(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tunecache.outbox_files import checked_folder

    url = server_url(args)
    try:  # the outbox refused (another user's, open to others' writes, a link, no folder)
        checked_folder(None, make=False)
    except OSError as exc:
        why = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else exc
        raise InvalidInput(f"the outbox cannot be used: {why}") from None
    return _pushed(url)


def _pushed(url: str) -> int:
    from tunecache import outbox
    from tunecache.client import Client
    from tunecache_cli.table import shown

    if unreadable := outbox.set_aside_unreadable():  # for no server: moved aside by any push
        print(f"{len(unreadable)} unreadable file{'' if len(unreadable) == 1 else 's'} set "
              f"aside in {outbox_dir() / 'rejected'}: {', '.join(map(shown, unreadable))}",
              file=sys.stderr)  # fmt: skip
    stuck = outbox.unreadable()  # rejected/ could not take them (set_aside said why)
    count = outbox.waiting(url)
    if not count:
        print(f"nothing waits for {url} in {outbox_dir()}", file=sys.stderr)
        _say_sending(url)
        for other, waiting in sorted(outbox.servers().items()):  # tuned for another server
            print(f"  {waiting} upload{' waits' if waiting == 1 else 's wait'} for {shown(other)}: "
                  f"tunecache push --server {shown(other)}", file=sys.stderr)  # fmt: skip
        return 1 if unreadable or stuck else 0
    preflight(url, "write", "pushing")
    with Client(url, timeout=Settings.from_env(with_url=False).timeout) as client:
        sent, refused, error, unserved = outbox.push(client, url)
    left = outbox.waiting(url)
    print(f"pushed {sent} of {count} waiting upload{'' if count == 1 else 's'} to {url}"
          + (f"; {refused} refused (in {outbox_dir() / 'rejected'})" if refused else "")
          + (f"; {left} still waiting" if left else "") + _unserved(unserved),
          file=sys.stderr)  # fmt: skip
    _say_sending(url)
    if left and error is not None and (error.status_code is None
                                       or error.status_code in (401, 403)):  # fmt: skip
        raise ServerError(f"pushing: {error}", status_code=error.status_code)
    return 0 if not (left or refused or unreadable or stuck) else 1


def _say_sending(url: str) -> None:
    """Uploads for ``url`` another process is sending now (a tune's own, another push): not
    waiting, and not nothing either."""
    from tunecache import outbox

    if busy := outbox.sending(url):
        print(f"  {busy} upload{' is' if busy == 1 else 's are'} being sent to {url} by another "
              "process (a tune, or another push) now", file=sys.stderr)  # fmt: skip


def push_quietly(client: Any, url: str) -> None:
    """After a tune's own upload the server took (in the outbox until then, however long this
    takes): what waits for ``url`` is sent too, said in one line if anything was; nothing here
    fails the tune. Not at the start: a tune refused as bad input (exit 2) or failing stores
    nothing."""
    from tunecache import outbox

    try:
        if not outbox.waiting(url):
            return
        sent, refused, _, unserved = outbox.push(client, url)
    except OSError as exc:
        print(f"tunecache: warning: the outbox {outbox_dir()} could not be read: {exc}",
              file=sys.stderr)  # fmt: skip
        return
    except Exception as exc:  # the tune's own upload is stored: this must not undo its exit 0
        print(f"tunecache: warning: the uploads waiting in {outbox_dir()} were not pushed: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)  # fmt: skip
        return
    if sent or refused:
        print(f"pushed {sent} waiting upload(s) to {url}"
              + (f"; {refused} refused" if refused else "") + _unserved(unserved),
              file=sys.stderr)  # fmt: skip


def _unserved(count: int) -> str:
    """What a push line ends with when ``count`` of the uploads it sent are stored, not served
    (the server's verified policy, a token not trusted)."""
    if not count:
        return ""
    return (f"; {count} of them stored but not served: this server serves verified records "
            "(once a verifier passes them) and trusted tokens' artifacts only")  # fmt: skip
