"""``tunecache push``: send the records a tune could not upload (the outbox,
:mod:`tunecache_cli.outbox`) to the server they were tuned for.

Exit 0 when nothing waits any more for that server, 1 when some could not be sent or were
refused (moved to the outbox's ``rejected/``), 2 bad input, 3 the server could not be reached.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tunecache.errors import ServerError
from tunecache.settings import Settings, outbox_dir
from tunecache_cli.args import add_server, preflight, server_url


def register(commands: Any) -> None:
    parser = commands.add_parser("push", help="upload the records a tune could not upload")
    add_server(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache_cli import outbox

    url = server_url(args)
    waiting = outbox.waiting(url)
    if not waiting:
        print(f"nothing waits for {url} in {outbox_dir()}", file=sys.stderr)
        return 0
    preflight(url, "write", "pushing")
    with Client(url, timeout=Settings.from_env().timeout) as client:
        sent, rejected, errors = outbox.push(client, url)
    left = len(waiting) - sent - rejected
    print(f"pushed {sent} of {len(waiting)} records to {url}"
          + (f"; {rejected} refused (in {outbox_dir() / 'rejected'})" if rejected else "")
          + (f"; {left} still waiting: {errors[-1]}" if left else ""), file=sys.stderr)  # fmt: skip
    if left and errors and "not answering" in errors[-1]:
        raise ServerError(errors[-1])
    return 0 if not (left or rejected) else 1


def push_quietly(client: Any, url: str) -> None:
    """At the start of a tune: what waits for ``url`` is sent first, in one line if anything
    was; a failure here is the tune's to meet, not this."""
    from tunecache_cli import outbox

    if not outbox.waiting(url):
        return
    sent, rejected, _ = outbox.push(client, url)
    if sent or rejected:
        print(f"pushed {sent} waiting record(s) to {url}"
              + (f"; {rejected} refused" if rejected else ""), file=sys.stderr)  # fmt: skip
