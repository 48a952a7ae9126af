"""``tunecache get``: look one key up (exit 0 hit, 1 miss, 2 bad input, 3 unreachable)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tunecache.cli.args import add_key, add_server, key_from_args, server_url
from tunecache.cli.table import ms, ratio
from tunecache.schemas import RecordPublic


def register(commands: Any) -> None:
    parser = commands.add_parser("get", help="fetch the validated winner of one key")
    add_key(parser)
    add_server(parser)
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.set_defaults(run=run)


def describe(record: RecordPublic) -> str:
    speedup = record.speedup()
    parts = [
        f"{record.key.to_key().short()}",
        f"  config     {record.config_summary or json.dumps(record.config)[:80]}",
        f"  time       {ms(record.timing.median_ms)} ms (median of {record.timing.repeats})",
        f"  speedup    {ratio(speedup)} than torch eager" if speedup else "  speedup    -",
        f"  validated  max rel error {record.validation.max_rel_error:.2e} "
        f"(tolerance {record.validation.tolerance:g}, {len(record.validation.checks)} checks)",
        f"  record     #{record.id}, {record.created_at:%Y-%m-%d %H:%M} UTC",
    ]
    return "\n".join(parts)


def run(args: argparse.Namespace) -> int:
    from tunecache.client import Client

    key = key_from_args(args)
    with Client(server_url(args)) as client:
        answer = client.fetch_answer(key)
    if answer is None:
        if args.json:
            print(json.dumps({"hit": False, "key": key.to_json(), "key_hash": key.digest()}))
        else:
            print(f"miss: {key.short()}")
        return 1
    if args.json:
        body = {"hit": True, "match": answer.match, "policy": answer.policy,
                "record": answer.record.model_dump(mode="json", by_alias=True)}  # fmt: skip
        print(json.dumps(body, indent=2))
    else:
        print(describe(answer.record))
        print(f"  matched    {answer.match} rule, {answer.policy} version policy")
    return 0
