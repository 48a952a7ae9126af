"""``tunecache report -o DIR``: PNG figures of the server's records.

``speedup.png`` (each winner vs the default config and torch eager), ``convergence.png`` (best
time so far per trial of each search) and ``coverage.png`` (status per kernel shape × backend ×
dtype × arch: from ``--manifest`` as ``tunecache coverage`` counts it, else tuned / unvalidated
from the records). One line per file written. Exit 0 written, 1 no record matches, 2 bad input
(no ``-o``, a folder that cannot be written, matplotlib missing), 3 unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from tunecache_cli.args import add_server, server_url
from tunecache_cli.filters import add_filters, check_filters, near_misses


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "report",
        help="PNG figures: speedups, search convergence, coverage",
        description="Draws the server's records (matching the filters) as PNGs in DIR: "
        "speedup.png, convergence.png, coverage.png. Needs matplotlib "
        "(pip install -e '.[report]').",
    )
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="DIR",
                        help="folder to write the PNGs into (created if need be)")  # fmt: skip
    add_filters(parser)
    parser.add_argument(
        "--manifest", type=Path, metavar="MANIFEST.toml",
        help="draw the coverage of this manifest's keys (default: of the records)",
    )  # fmt: skip
    add_server(parser)
    parser.set_defaults(run=run)


def _matches(key: Any, args: argparse.Namespace) -> bool:
    """Whether a manifest key passes the command's filters."""
    return all(wanted is None or actual == wanted for wanted, actual in (
        (args.kernel, key.kernel), (args.backend, key.backend),
        (args.device_arch, key.device.arch)))  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from tunecache.folders import output_dir

    made = [p for p in (args.output, *args.output.parents) if not p.exists()]
    out = output_dir(args.output)
    code = 1
    try:
        code = _report(args, out)
        return code
    finally:  # a report that failed leaves none of the folders it made, if still empty
        for folder in made if code != 0 else ():
            with contextlib.suppress(OSError):
                folder.rmdir()


def _report(args: argparse.Namespace, out: Path) -> int:
    from tunecache.client import Client
    from tunecache.report import build, collect, grid
    from tunecache.report.series import MAX_CONVERGENCE_KEYS
    from tunecache_cli.progress import asking

    check_filters(args)
    build.require_matplotlib()
    manifest = None
    if args.manifest is not None:
        from tunecache.manifest import load_manifest

        manifest = load_manifest(args.manifest)
    url = server_url(args)
    filters = {"kernel": args.kernel, "backend": args.backend, "device_arch": args.device_arch}
    with Client(url) as client, asking("report", url):
        records = collect.fetch_records(client, **filters)
        if not records:
            named = ", ".join(f"{k}={v}" for k, v in filters.items() if v is not None)
            print(f"tunecache report: no records match{' ' + named if named else ''} on {url}"
                  f"{near_misses(args)}", file=sys.stderr)  # fmt: skip
            return 1
        winners = [r for r in records if r.is_winner]
        searches = collect.fetch_searches(client, winners, keys=MAX_CONVERGENCE_KEYS)
    if manifest is not None:
        from tunecache_cli.coverage import manifest_states

        keys = [key for key in manifest.keys if _matches(key, args)]
        states: list[tuple[Any, str]] = [(k, s) for k, s, _ in manifest_states(manifest, url, keys)]
        source = f"manifest {args.manifest.name}"
    else:
        states, source = list(grid.record_states(records)), "records"
    report = build.write_report(out, winners=winners, searches=searches, states=states,
                                source=source)  # fmt: skip
    for written in report.written:
        print(f"{written.path}: {written.what}")
    for why in report.skipped:
        print(f"tunecache report: {why}", file=sys.stderr)
    return 0
