"""``tunecache records ls|show``: what the cache holds, filtered; one record with its trials."""

from __future__ import annotations

import argparse
import json
from typing import Any, get_args

from tunecache.errors import InvalidInput
from tunecache.key import kernel_names, problem_text
from tunecache.schemas import RecordPublic, RecordStatus
from tunecache.timing import versus
from tunecache_cli.args import add_server, check_count, server_url
from tunecache_cli.filters import add_filters, check_filters, near_misses
from tunecache_cli.table import ms, render, shown

MAX_LIMIT = 1000
STATUSES = get_args(RecordStatus)


def register(commands: Any) -> None:
    parser = commands.add_parser("records", help="list the cached records, or show one")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("ls", help="records matching filters, newest first")
    add_filters(listing, dtype=True)
    listing.add_argument("--all", action="store_true",
                         help="every record, not only each key's winner")  # fmt: skip
    listing.add_argument("--status", choices=STATUSES, help="only records of this status")
    listing.add_argument("--limit", type=int, default=50, help=f"at most N (≤ {MAX_LIMIT})")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    add_server(listing)
    listing.set_defaults(run=run_ls)
    show = actions.add_parser("show", help="one record, with every trial of its search")
    show.add_argument("record_id", type=int, metavar="ID")
    show.add_argument("--json", action="store_true", help="print it as JSON")
    add_server(show)
    show.set_defaults(run=run_show)


def run_ls(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache.pages import fetch_first
    from tunecache_cli.progress import asking

    check_count("--limit", args.limit, 1, MAX_LIMIT)
    check_filters(args)
    every = args.all or args.status in ("disputed", "rejected")  # never a key's winner
    filters = {"kernel": args.kernel, "backend": args.backend, "dtype": args.dtype,
               "device_arch": args.device_arch, "status": args.status,
               "winners_only": None if every else True}  # fmt: skip
    url = server_url(args)
    with Client(url) as client, asking("records ls", url):  # pages: a server may cut one short
        found = fetch_first(client, args.limit, **filters)
    if args.json:
        print(json.dumps({"count": found.count,
                          "items": [r.model_dump(mode="json", by_alias=True) for r in found.items]},
                         indent=2))  # fmt: skip
        return 0 if found.items else 1
    if not found.items:
        print(f"no records match{near_misses(args)}")
        return 1
    rows = []
    kernels = kernel_names([r.key for r in found.items])
    for r, kernel in zip(found.items, kernels, strict=True):
        shape = problem_text(r.key.problem)
        valid = "yes" if r.validation.passed else "NO"
        rows.append([f"#{r.id}", kernel, r.key.backend, r.key.dtype, shape,
                     r.key.device.arch, _time(r), versus(r),
                     _caveat(r), valid, r.status,
                     f"{r.created_at:%Y-%m-%d %H:%M}"])  # fmt: skip
    header = ["record", "kernel", "backend", "dtype", "shape", "arch", "ms", "vs eager",
              "timing", "valid", "status", "created (UTC)"]  # fmt: skip
    print(render(header, rows))
    if any(r.believed_timing is not r.timing for r in found.items):
        print(
            "ms: the verifier's time (v) where a verifier re-timed the record, else the uploader's"
        )
    more = "" if len(found.items) == found.count else " (raise --limit for more)"
    print(f"{len(found.items)} of {found.count} {'records' if every else 'winners'}{more}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from tunecache import search_times
    from tunecache.client import Client
    from tunecache_cli.get import describe
    from tunecache_cli.progress import asking
    from tunecache_cli.trials import count_text, default_trial, trial_rows

    if args.record_id < 1:
        raise InvalidInput(f"ID {args.record_id}: a record ID is a whole number from 1 up")
    url = server_url(args)
    with Client(url) as client, asking("records show", url):
        record = client.get_record(args.record_id)
    if args.json:
        # json.dumps escapes every character past ASCII: the server's strings cannot carry a
        # terminal's controls (C1, bidi) to it, as model_dump_json let them
        print(json.dumps(record.model_dump(mode="json", by_alias=True), indent=2))
        return 0
    print(describe(record))
    print(shown(f"  search     {record.search.strategy}, {count_text(record)}; tuned in "
                f"{record.search.seconds:.1f} s"))  # fmt: skip
    if rows := trial_rows(record):
        print(render(["trial", "status", "ms", "config", "error"], rows))
    said = search_times.note(record.search.strategy, record.key.backend,
                             [t.time_ms for t in record.trials],
                             record.believed_timing.median_ms, ms,
                             default_last=default_trial(record))  # fmt: skip
    if said is not None:  # a trial's time beside the winner's read as the record's time
        print(shown(said))
    return 0


def _time(record: RecordPublic) -> str:
    """The time the server ranks ``record`` by (the verifier's, marked ``v``, once it re-timed
    it: a claimed time it found too fast is never shown as the record's)."""
    timing = record.believed_timing
    return ms(timing.median_ms) + (" v" if timing is not record.timing else "")


def _caveat(record: RecordPublic) -> str:
    """What to know of ``record``'s time: Triton's interpreter on the host (no GPU's time),
    noisy, or only a baseline's noisy, else ``-``."""
    if record.believed_timing.interpreted:
        return "interpreter"
    return record.noise_label or "-"
