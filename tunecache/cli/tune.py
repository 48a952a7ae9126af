"""``tunecache tune``: tune one key on this machine, validate it, upload the record."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tunecache.cli.args import add_key, add_server, key_parts, server_url
from tunecache.errors import InvalidInput


def register(commands: Any) -> None:
    parser = commands.add_parser("tune", help="tune one key and upload the validated winner")
    add_key(parser)
    parser.add_argument("--trials", type=int, default=32, help="search budget in trials")
    parser.add_argument("--seconds", type=float, help="search budget in seconds")
    parser.add_argument("--no-upload", action="store_true", help="tune and print, store nothing")
    add_server(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from backends import Budget
    from tunecache.cli.get import describe
    from tunecache.cli.progress import ProgressPrinter
    from tunecache.client import Client
    from tuner import tune
    from workloads import make_key

    parts = key_parts(args)
    key = make_key(**parts)  # bad input fails here, before anything is compiled
    try:
        budget = Budget(trials=args.trials, seconds=args.seconds)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    url = None if args.no_upload else server_url(args)
    outcome = tune(
        parts["workload"],
        parts["backend"],
        parts["problem"],
        parts["dtype"],
        budget,
        progress=ProgressPrinter(key.short()),
    )
    record = outcome.record
    if url is None:
        print(record.model_dump_json(by_alias=True, indent=2, exclude={"trials"}))
        return 0
    with Client(url) as client:
        result = client.upload(record)
        stored = client.get_record(result.record_id)
    print(describe(stored))
    state = "the winner" if result.is_winner else f"kept; #{result.winner_record_id} is faster"
    print(f"uploaded record #{result.record_id} to {url}: {state}", file=sys.stderr)
    return 0
