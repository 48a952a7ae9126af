"""``tunecache snapshot export|import``: the winners of a device arch as one file, and back.

``export`` writes the server's snapshot atomically to ``-o FILE`` (a file ``Client(snapshot=…)``
answers lookups from, or one to bake into an image), with each record's provenance; ``import``
merges a file into a server, where the faster validated record of each key wins, and each record
keeps the status, uploader and verifier its file states (verified only from a trusted token; a
file without provenance: pending). Exit 0 done, 1 rejected by the server for another
reason, 2 bad input (bad filter, an output folder that does not exist, an unreadable or invalid
file, or one the server refuses as invalid or too large: 400, 413, 422), 3 server unreachable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tunecache.errors import InvalidInput, error_message
from tunecache.snapshot import SnapshotFilters
from tunecache_cli.args import add_server, output_file, server_url
from tunecache_cli.exports import replaceable, write_export
from tunecache_cli.filters import add_filters, check_filters
from tunecache_cli.table import counted


def register(commands: Any) -> None:
    parser = commands.add_parser("snapshot", help="export or import the winners of a device arch")
    actions = parser.add_subparsers(dest="action", required=True)
    export = actions.add_parser("export", help="write the winners of a device arch to a file")
    export.add_argument("--arch", required=True, help="device arch, e.g. sm_90 or cpu-avx2")
    export.add_argument("--device-name", help="only this device name")
    add_filters(export, arch=False)
    export.add_argument("-o", "--output", required=True, type=Path, metavar="FILE")
    add_server(export)
    export.set_defaults(run=run_export)
    merge = actions.add_parser("import", help="merge a snapshot file into the server")
    merge.add_argument("file", type=Path, metavar="FILE")
    add_server(merge)
    merge.set_defaults(run=run_import)


_FLAGS = {"device_arch": "--arch", "device_name": "--device-name"}


def _filters(args: argparse.Namespace) -> SnapshotFilters:
    check_filters(args)
    given = {
        "device_arch": args.arch,
        "device_name": args.device_name,
        "kernel": args.kernel,
        "backend": args.backend,
    }
    try:
        return SnapshotFilters.model_validate({k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        raise InvalidInput(f"{_FLAGS.get(name, f'--{name}')}: {error_message(first)}") from None


def run_export(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache_cli.progress import asking

    filters = _filters(args)
    output_file("-o", args.output)  # its folder exists: said before the server is asked
    replaceable("-o", args.output)  # and it is no other file
    url = server_url(args)
    with Client(url) as client, asking("snapshot export", url):
        document, etag = client.export_snapshot(
            filters.device_arch,
            device_name=filters.device_name,
            kernel=filters.kernel,
            backend=filters.backend,
            provenance="true",  # who measured and vouched for each record: kept by an import
        )
    assert document is not None  # no If-None-Match sent: a 304 is refused (Client.export_snapshot)
    write_export(args.output, document, etag, lambda n: f"exported {n} to {args.output}",
                 arch_given=filters.device_arch, arch=filters.device_arch,
                 device_name=filters.device_name, kernel=filters.kernel,
                 backend=filters.backend)  # fmt: skip
    return 0


def run_import(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache.snapshot import load_snapshot
    from tunecache_cli.progress import asking

    snapshot = load_snapshot(args.file)
    if not snapshot.records and _records_in(args.file):  # each left out, as warned
        raise InvalidInput(f"{args.file}: no record of it may be imported (each was left out, "
                           "as said above); nothing imported")  # fmt: skip
    url = server_url(args)
    with Client(url) as client, asking("snapshot import", url):
        result = client.import_snapshot(snapshot)
    print(
        f"imported {counted(result['imported'], 'record')} from {args.file} into {url}: "
        f"{counted(result['winners_changed'], 'winner')} changed"
    )
    retimed = sum(p.retimed for p in snapshot.provenance or ())
    if retimed and result["imported"] < len(snapshot.records):  # said nothing, exit 0
        print(f"tunecache: {counted(retimed, 'record')} of {args.file} a verifier re-timed: a "
              "server stores those from a trusted token's import only (`tunecache token "
              "create ... --trusted`); the others not stored it held already",
              file=sys.stderr)  # fmt: skip
    return 0


def _records_in(path: Path) -> int:
    """How many records the snapshot file at ``path`` lists, valid or not."""
    from tunecache.jsonsafe import parse_json
    from tunecache.snapshot import read_snapshot_bytes

    document = parse_json(read_snapshot_bytes(path))
    records = document.get("records") if isinstance(document, dict) else None
    return len(records) if isinstance(records, list) else 0
