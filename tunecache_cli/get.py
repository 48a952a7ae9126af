"""``tunecache get``: look one key up (exit 0 hit, 1 miss, 2 bad input, 3 unreachable)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from tunecache.believed import APART_RATIO, named_once
from tunecache.explain import Nearby
from tunecache.key import Key
from tunecache.schemas import RecordCreate, RecordPublic
from tunecache.timing import conditions_text, noise_text, versus
from tunecache.verification import trust_text
from tunecache_cli.args import add_key, add_server, key_from_args, server_url
from tunecache_cli.table import counted, ms, shown
from tunecache_cli.trials import config_text


def register(commands: Any) -> None:
    parser = commands.add_parser("get", help="fetch the validated winner of one key")
    add_key(parser)
    add_server(parser)
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.add_argument("--policy", choices=("strict", "compatible", "any"), default="strict",
                        help="which tuned versions may serve (default: strict)")  # fmt: skip
    parser.add_argument("--explain", action="store_true",
                        help="on a miss, list the nearest records and what differs")  # fmt: skip
    parser.set_defaults(run=run)


def describe(record: RecordCreate, *, uploaded: int | None = None) -> str:
    """The record in a few lines, a field each; what the server holds in a line is escaped
    (:func:`shown`): a name cannot add a line, or hide one, on a terminal. The config is said
    from the config itself (:func:`config_text`), not by its uploader's summary. A record
    not stored (``tune --no-upload``) says so where a stored one says who vouches for it; one
    ``uploaded`` as that record id but not read back says that."""
    stored = record if isinstance(record, RecordPublic) else None
    timing = record.timing if stored is None else stored.believed_timing
    noisy = noise_text(record)
    parts = [
        f"{record.key.to_key().short()}",
        f"  config     {config_text(record.key.backend, record.config, 80)}",
        f"  time       {ms(timing.median_ms)} ms ({timing.timer}"
        f"{', the verifier' if timing is not record.timing else ''})",
        "  speedup    " + _versus_eager(record),
        "             " + versus(record, "default_config", than="the default config")
        if record.speedup("default_config")
        else "",
        f"  machine    {conditions_text(timing.conditions)}" if timing.conditions else "",
        f"  timing     {noisy}" if noisy else "",
        f"  validated  max rel error {record.validation.max_rel_error:.2e} "
        f"(tolerance {record.validation.tolerance:g}, "
        f"{counted(len(record.validation.checks), 'check')})",
        f"  trust      {trust_text(stored)}" if stored else _unstored(uploaded),
        f"  record     #{stored.id}, {stored.created_at:%Y-%m-%d %H:%M} UTC" if stored else "",
    ]
    return "\n".join(shown(part) for part in parts if part)


def _unstored(uploaded: int | None) -> str:
    if uploaded is None:
        return "  stored     no (validated here)"
    return f"  stored     as #{uploaded}; not read back, so who vouches for it is not shown"


def _versus_eager(record: RecordCreate) -> str:
    """The record against torch eager; ``not believed`` once a verifier's time and its
    uploader's differ too much for the uploader's comparisons to stand."""
    if record.baselines and not record.comparisons():
        if not named_once(record.baselines):
            return "not believed: its baselines name one twice (stored before that was refused)"
        return (f"not believed: the verifier's time and its uploader's differ over "
                f"{APART_RATIO}x, and its uploader timed eager")  # fmt: skip
    return versus(record, than="torch eager")


def run(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache.served import checked_answer

    key = key_from_args(args)
    with Client(server_url(args), policy=args.policy) as client:
        # what a process would refuse is no hit here either: the server is not trusted
        answer, refused = checked_answer(key, client.fetch_answer(key), args.policy)
        nearest = _nearest(client, key) if answer is None and args.explain else None
        unserved = _unserved(client, key) if answer is None and not args.json else []
    if answer is None:
        if args.json:
            body: dict[str, Any] = {"hit": False, "key": key.to_json(), "key_hash": key.digest(),
                                    "policy": args.policy}  # fmt: skip
            if nearest is not None:
                body["nearest"] = [asdict(n) for n in nearest]
            if refused is not None:
                body["refused"] = refused
            print(json.dumps(body, indent=2))
        else:
            print(f"miss: {key.short()} (under the {args.policy} version policy)")
            for line in [refused] if refused is not None else unserved:
                print(f"  {shown(line)}")
            if nearest is not None:
                print(_explained(key, nearest))
            else:  # an edit of the kernel's file, another version: said only by --explain
                print("  --explain lists the records nearest this key and what differs (the "
                      "kernel's code, versions, the shape)")  # fmt: skip
        return 1
    if args.json:
        body = {"hit": True, "match": answer.match, "policy": answer.policy,
                "record": answer.record.model_dump(mode="json", by_alias=True)}  # fmt: skip
        print(json.dumps(body, indent=2))
    else:
        print(describe(answer.record))
        # a bucket or same-arch match serves another key's record: the line names the key asked
        asked = "" if answer.match == "exact" else f" for {key.short()}"
        print(shown(f"  matched    {answer.match} rule{asked}, {answer.policy} version policy"))
    return 0


def _unserved(client: Any, key: Key) -> list[str]:
    """Why the key's own records were not served (pending under the verified policy, disputed,
    rejected, not validated), a line each; none when it has none or they cannot be listed."""
    from tunecache.errors import ServerError

    try:
        found = client.list_records(key_hash=key.digest(), limit=5,
                                    timeout=client.timeout.lookup).items  # fmt: skip
    except ServerError:
        return []
    return [f"record #{r.id}: {'failed validation' if not r.validation.passed else trust_text(r)}"
            for r in found]  # fmt: skip


def _nearest(client: Any, key: Key) -> list[Nearby]:
    from tunecache.explain import explain

    found = client.list_records(kernel=key.kernel, backend=key.backend, validated=True,
                                limit=1000)  # fmt: skip
    tuned = [(r.id, r.key.model_dump(mode="json", by_alias=True)) for r in found.items]
    return explain(key.to_json(), tuned)


def _explained(key: Key, nearest: list[Nearby]) -> str:
    if not nearest:
        return f"no validated record of {key.kernel} on {key.backend} at all: tune it"
    lines = [f"nearest validated records of {key.kernel} on {key.backend}:"]
    for n in nearest:
        if n.served_under is not None:
            how = f"served with --policy {n.served_under} ({n.rule} rule)"
        else:
            how = "never served for this key"
        differs = "; ".join(n.differences) or "nothing"
        lines.append(shown(f"  #{n.record_id}: {how}; differs: {differs}"))
    return "\n".join(lines)
