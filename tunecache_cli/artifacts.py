"""``tunecache artifacts ls``: what the team cache holds beside records, for this machine.

The integrations share their backends' own JSON as artifacts (Inductor's GEMM choice timings and
Triton best configs, MetaSchedule's workloads and tuning records, serving engines' fused-MoE
files), each partitioned by what makes it valid. ``records ls`` shows records only: an
``inductor.enable()`` or ``tune --torch`` upload was seen nowhere but its own line.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, cast

from tunecache.artifacts import MAX_PAGE, NAMESPACES, ArtifactPublic, Namespace
from tunecache.errors import InvalidInput
from tunecache_cli.args import add_server, check_count, server_url
from tunecache_cli.table import counted, ms, render

# What a bare ``artifacts ls`` lists: Inductor's, whose partition this machine can name itself.
INDUCTOR = ("inductor.choices", "inductor.autotune")
SUMMARY = 60  # characters of a value shown in the table
KEY_SHOWN = 40  # characters of a key shown in the table
# What a best config holds beside the config itself (AutotuneCache.save's bookkeeping).
_BOOKKEEPING = {"configs_hash", "found_by_coordesc", "time_taken_ms", "triton_cache_hash"}
# A namespace's score in milliseconds: TVM's is its records' mean run time in seconds
# (tunecache.tvm.wire), Inductor's choices' their fastest time in ms.
_SCORE_MS: dict[str, float] = {"tvm.record": 1000.0}


def register(commands: Any) -> None:
    parser = commands.add_parser("artifacts", help="list what the integrations share (Inductor, "
                                 "MetaSchedule, fused-MoE files)")  # fmt: skip
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("ls", help="one partition's items, best score first per key")
    listing.add_argument("--namespace", choices=NAMESPACES,
                         help="only this kind (default: every kind the partition holds, or "
                              "Inductor's two in this machine's partition)")  # fmt: skip
    listing.add_argument("--partition", help="the partition (default: this machine's Inductor "
                         "partition; required for the other namespaces)")  # fmt: skip
    listing.add_argument("--key", help="only this key's items")
    listing.add_argument("--limit", type=int, default=50,
                         help=f"at most N per namespace (≤ {MAX_PAGE})")  # fmt: skip
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    add_server(listing)
    listing.set_defaults(run=run_ls)


def run_ls(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache_cli.progress import asking

    check_count("--limit", args.limit, 1, MAX_PAGE)
    # A partition named: every kind (a TVM partition's records were listed as "inductor.choices:
    # 0 items", exit 1); none: this machine's Inductor partition, the one it can name itself.
    every = NAMESPACES if args.partition is not None else INDUCTOR
    namespaces = cast(tuple[Namespace, ...], (args.namespace,) if args.namespace else every)
    partition = args.partition if args.partition is not None else _own_partition(namespaces)
    if not partition.strip() or len(partition) > 256:
        raise InvalidInput(f"--partition {partition!r}: expected 1 to 256 characters")
    url = server_url(args)
    with Client(url) as client, asking("artifacts ls", url):
        # one more than shown: whether there are more is known, not guessed from the count
        found = {ns: client.get_artifacts(ns, partition, key=args.key, limit=args.limit + 1)
                 for ns in namespaces}  # fmt: skip
    more = {ns for ns, items in found.items() if len(items) > args.limit}
    for ns, items in found.items():  # a partition's pages come by id: each key's best first
        found[ns] = sorted(items[: args.limit], key=_ranked)
    if args.json:
        print(json.dumps({"partition": partition, "items": [
            item.model_dump(mode="json") for items in found.values() for item in items]},
            indent=2))  # fmt: skip
        return 0 if any(found.values()) else 1
    print(f"partition {partition}")
    held = {ns: items for ns, items in found.items() if items or args.namespace}
    for namespace, items in (held if held and every is NAMESPACES else found).items():
        raise_it = "; raise --limit" if args.limit < MAX_PAGE else ""
        print(f"{namespace}: {counted(len(items), 'item')}"
              f"{f' (more not listed{raise_it})' if namespace in more else ''}")  # fmt: skip
        if items:
            print(render(["id", "key", "item", "score ms", "value", "updated (UTC)"],
                         [_row(item) for item in items]))  # fmt: skip
    return 0 if any(found.values()) else 1


def _ranked(item: ArtifactPublic) -> tuple[str, bool, float, int]:
    return (item.key, item.score is None, item.score or 0.0, item.id)


def _own_partition(namespaces: tuple[Namespace, ...]) -> str:
    if any(ns not in INDUCTOR for ns in namespaces):
        raise InvalidInput(f"--namespace {namespaces[0]} needs --partition: its partitions are "
                           "named by a target or device, not this machine's Inductor")  # fmt: skip
    from tunecache.inductor.partition import partition

    return partition()


def _row(item: ArtifactPublic) -> list[object]:
    # cut in the middle: keys of one op share their start (packed_linear|highest|[[8, 16]...)
    key = item.key if len(item.key) <= KEY_SHOWN else f"{item.key[:24]}...{item.key[-13:]}"
    score = "-" if item.score is None else ms(item.score * _SCORE_MS.get(item.namespace, 1.0))
    return [item.id, key, item.item or "-", score, _summary(item),
            f"{item.updated_at:%Y-%m-%d %H:%M}"]  # fmt: skip


def _summary(item: ArtifactPublic) -> str:
    """The value in a few words: an Inductor choice group's op and how many choices it timed, a
    best config's arguments, else the JSON itself, cut to :data:`SUMMARY` characters."""
    value = item.value
    if item.namespace == "inductor.choices" and isinstance(value, dict):
        timings = value.get("timings")
        count = len(timings) if isinstance(timings, dict) else 0
        text = f"{value.get('op')} {value.get('precision')}, {counted(count, 'choice')} timed"
    elif item.namespace == "inductor.autotune" and isinstance(value, dict):
        text = " ".join(f"{k}={v}" for k, v in value.items() if k not in _BOOKKEEPING)
    else:
        text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= SUMMARY else text[: SUMMARY - 3] + "..."
